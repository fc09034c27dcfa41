"""Training state on disk: checkpoints, resume, Hugging Face folders.
"""
