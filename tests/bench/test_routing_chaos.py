"""bench/routing_chaos.py on the tiny checkpoint's shapes: one block of lines a run, a line a layer, and
the float32 run with 1e-4 noise on the embedding staying within 1e-3 with no expert set changed; with
--lora, how often a random adapter changes the argmax."""

from __future__ import annotations

import re

from bench.routing_chaos import main


def test_routing_chaos_reports_each_layer_of_each_run(capsys):
    assert main(["--preset", "tiny", "--layers", "2", "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    blocks = dict(re.findall(r"^(\S+)\n((?:  .*\n)+)", out, flags=re.M))
    assert list(blocks) == ["bf16", "fp32+1e-4", "fp32+1e-2"]
    for lines in blocks.values():
        assert len(re.findall(r"^  layer \d: rel diff", lines, flags=re.M)) == 2
        assert "top-1 agreement" in lines
    calm = [float(x) for x in re.findall(r"rel diff ([\d.e+-]+)", blocks["fp32+1e-4"])]
    assert len(calm) == 3 and max(calm) < 1e-3
    assert re.findall(r"expert sets changed ([\d.]+)%", blocks["fp32+1e-4"]) == ["0.0", "0.0"]
    bf16_first = float(re.search(r"layer 0: rel diff ([\d.e+-]+)", blocks["bf16"])[1])
    assert 1e-3 < bf16_first < 5e-2  # bf16's rounding, not zero and not chaos yet
    assert re.search(r"^float32 top-1 margin / logit std: median [\d.]+$", out, flags=re.M)


def test_lora_reports_how_often_the_adapter_moves_the_argmax(capsys):
    # The default tiny draw is chaotic: make_lora's adapter (0.25 of each branch output) moves nearly
    # every argmax, and bf16 parts from float32 on some of them.
    assert main(["--preset", "tiny", "--layers", "2", "--tokens", "16", "--lora", "4"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    m = re.fullmatch(
        r"lora rank 4, delta 0.25: float32 top-1 agreement with the base ([\d.]+)%, "
        r"bf16 with float32 ([\d.]+)%",
        line,
    )
    assert m, line
    assert float(m[1]) < 50  # 6.2 % here; the exact share and bf16's (87.5 %) follow the CPU's float sums
    assert 0 <= float(m[2]) <= 100
