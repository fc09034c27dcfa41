"""``hexiscale hf import|export``: Hugging Face Llama folders in and out of our checkpoints.

    hexiscale hf import HF_DIR -o CKPT [--seq-len S]
        config.json + safetensors (one file or sharded) -> a step-0 checkpoint any plan resumes
        from (hexiscale train --resume CKPT fine-tunes it)
    hexiscale hf export CKPT -o HF_DIR [--dtype fp32|bf16|fp16] [--max-shard-gib G]
        a checkpoint (any plan wrote it; or a --checkpoint-dir: its latest) -> a folder that
        transformers' LlamaForCausalLM.from_pretrained loads

Import memory-maps the weights; export holds one shard at a time. Neither overwrites a folder that
is not an earlier checkpoint (export) of its own.
"""

from __future__ import annotations

import argparse

from hexiscale.cli.output import console


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("hf", help="import a Hugging Face Llama folder as a checkpoint, or export one")
    hsub = p.add_subparsers(dest="hf_command", metavar="ACTION", required=True)
    im = hsub.add_parser("import", help="HF folder (config.json + safetensors) -> checkpoint")
    im.add_argument("folder", metavar="HF_DIR")
    im.add_argument("-o", "--output", required=True, help="checkpoint folder to write")
    im.add_argument("--seq-len", type=int, dest="seq_len", help="the model's seq_len (default: "
                    "max_position_embeddings; it does not change the weights)")
    im.set_defaults(func=run)
    ex = hsub.add_parser("export", help="checkpoint -> HF folder (config.json + safetensors)")
    ex.add_argument("checkpoint", metavar="CKPT", help="a checkpoint, or a --checkpoint-dir (its latest)")
    ex.add_argument("-o", "--output", required=True, help="HF folder to write")
    ex.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"), help="weights' dtype")
    ex.add_argument("--max-shard-gib", type=float, default=2.0, help="shard the weights above this size")
    ex.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from executor.state.checkpoint_verify import find_checkpoint
    from executor.state.hf_convert import export_hf, import_hf

    if args.hf_command == "import":
        model = import_hf(args.folder, args.output, args.seq_len)
        console.print(f"wrote {args.output}: {model.name}, {model.param_count():,} parameters, step 0 (train it "
                      f"with --resume {args.output} under any plan of this model)", highlight=False)
        return 0
    files = export_hf(find_checkpoint(args.checkpoint), args.output, dtype=args.dtype,
                      max_shard_bytes=int(args.max_shard_gib * 2**30))
    console.print(f"wrote {args.output}: {', '.join(f.name for f in files)}", highlight=False)
    return 0
