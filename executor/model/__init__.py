"""The Llama model the executor trains: layers, initialisation, recompute, fast GPU paths.
"""
