"""`jetrl demo`: the product a newcomer runs first, apart from launching (launcher/up.py starts the
services; this package only drives them).

    run.py       the demo: a tiny model learns the demo task through every service (`jetrl demo`)
    task.py      the demo tasks' data (maxdigit, reverse, sort): rows, train/held-out split, JSONL writers
    ablation.py  `jetrl demo --ablation`: the same run with and without the decoupled objective
    report.py    the demo's summary, plots and report files
"""
