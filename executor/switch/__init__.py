"""Changing the layout of a running job: elastic switches between plans, hot switching between a pool's
strategies.
"""
