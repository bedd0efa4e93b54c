"""The bottom layer: key names, the job's codec, the scripts and how they are called, Redis clients.

Everything above (producing, reading, the worker, the schedules) talks to Redis through these modules;
they import only core's defaults and errors.
"""
