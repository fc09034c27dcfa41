"""``hexiscale data prep``: text, JSONL or Parquet corpora -> a tokenizer -> token files.

:mod:`.corpus` reads documents in batches, :mod:`.tokenizer` loads a ``tokenizers`` tokenizer,
:mod:`.pipeline` tokenizes the batches in worker processes and writes them in order,
:mod:`.summary` counts what was written. numpy and ``tokenizers`` only (no torch).
"""
