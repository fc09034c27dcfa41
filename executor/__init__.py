"""HexiScale executor: asymmetric 3D-parallel training on torch.distributed."""
