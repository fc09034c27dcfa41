"""One `hexiscale train` rank: configuration, pre-flight, the training loop, its runners, engine,
optimizer and what a run logs.
"""
