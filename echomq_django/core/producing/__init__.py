"""Putting work in: the Queue (adds, cancels, retries), job handles, workflows and their hand-offs, tracing.

Imports only the protocol layer below it.
"""
