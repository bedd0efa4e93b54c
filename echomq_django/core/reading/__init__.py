"""Reads for operators' pages: inspection, the job browser, metrics, flow control's state, bulk runs.

Imports the protocol and producing layers below it, never the worker.
"""
