"""`tune-engine census MODEL DATA`: the routing census of a dataset through a MoE model's base weights
(engine.train.census): token-choices per expert of each MoE layer, and the experts no token reaches."""

from __future__ import annotations

import argparse
import json
import sys

from ..io.files import atomic_write
from ..train.census import CensusProgress, routing_census
from ..train.encode import EncodeOptions


def add_command(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser(
        "census",
        help="how many of a dataset's tokens the base model routes to each expert (MoE models)",
        description="One forward pass of the base model (no adapter) over the dataset's prepared tokens, "
        "prompt tokens included, counting for each MoE layer the token-choices each expert receives (a "
        "token counts once per chosen expert). Cached under the app's data folder per model file, "
        "dataset and settings.",
    )
    s.add_argument("model", help="a MoE model GGUF")
    s.add_argument("data", help="the JSON Lines dataset")
    s.add_argument("--template-file", help="Jinja chat template overriding the model's")
    s.add_argument("--n-ctx", type=int, default=512, help="window length in tokens (default 512)")
    s.add_argument("--prompt-format", choices=("chat", "raw"), default="chat", help="as training's")
    s.add_argument("--train-on-prompt", action="store_true", help="as training (no effect on counts)")
    s.add_argument("--no-cache", action="store_true", help="count again and keep nothing")
    s.add_argument("--json", dest="json_out", help="also write the census as JSON to this file")
    s.set_defaults(func=cmd_census)


def cmd_census(args: argparse.Namespace) -> int:
    options = EncodeOptions(args.n_ctx, args.train_on_prompt, args.prompt_format)

    def progress(p: CensusProgress) -> None:
        if sys.stderr.isatty() and p.total:
            print(f"\r{p.phase} {100 * p.done // p.total}%", end="", file=sys.stderr, flush=True)

    c = routing_census(
        args.model, args.data, args.template_file, options,
        cache=None if args.no_cache else "auto", on_progress=progress,
    )  # fmt: skip
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(
        f"{c.n_tokens} tokens of {c.n_samples} samples, top-{c.K} of {c.n_experts} experts"
        + (" (cached)" if c.reused else "")
    )
    for row, layer in enumerate(c.layers):
        counts = c.counts[row]
        print(f"layer {layer}: " + " ".join(str(int(n)) for n in counts))
    unreached = c.unreached()
    total = len(c.layers) * c.n_experts
    print(f"unreached: {len(unreached)} of {total} experts", end="")
    print(": " + ", ".join(f"layer {i} expert {e}" for i, e in unreached) if unreached else "")
    if args.json_out:
        with atomic_write(args.json_out, "w") as f:
            json.dump(c.to_json(), f, indent=1)
    return 0
