"""HexiScale executor: asymmetric 3D-parallel training on torch.distributed.

One subpackage per concept: ``train`` (a ``hexiscale train`` rank: config, pre-flight, the one
training loop and its runners, engine, optimizer, logs), ``parallel`` (groups, p2p, TP layers,
gradient sync, ZeRO-1, the schedules' interpreter), ``model`` (the Llama stage and its fast paths),
``data`` (token files, batches, mixed-length documents, data preparation), ``state`` (checkpoints,
resume, Hugging Face folders), ``switch`` (elastic and hot switching), ``job`` (the rank side of a
launch: environment, heartbeats, exit codes, fault injection) and ``profiler``. The pure rank and
reshard arithmetic lives in ``planner`` (no torch).
"""
