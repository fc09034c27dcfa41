"""Training data: token files, batches, documents of mixed length, packing, and data preparation.
"""
