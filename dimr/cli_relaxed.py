"""CLI commands of relaxed verification: ``diversed train``, ``bench-relaxed``, ``relaxed-methods``.

Thin: parse, call ``dimr.relaxed``, print. ``dimr decode --verify METHOD --param k=v --head h.safetensors``
lives in ``dimr.cli_decode`` and builds its rule with :func:`dimr.relaxed.rule_from_cli`.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dimr.cli import console, err_console, print_json
from dimr.errors import DimrError

diversed_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, help="DIVERSED: train a learned ensemble head.")


def _threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise DimrError(f"--threads {threads} must be at least 1")
    import torch

    torch.set_num_threads(threads or 1)


@diversed_app.command("train")
def diversed_train(
    pair: str = typer.Option(..., "--pair", help="model pair (see `dimr pairs`)"),
    task: str = typer.Option("", "--task", help="arithmetic | addition | toy-draft | toy-full (default: the "
                             "pair's own task: addition for smollm2, arithmetic else)"),
    out: Path = typer.Option(Path("diversed_head.safetensors"), "--out", help="head file (JSON config beside it)"),
    steps: int = typer.Option(30, "--steps", help="REINFORCE steps"),
    batch: int = typer.Option(8, "--batch", help="rollouts per step"),
    lr: float = typer.Option(5e-4, "--lr", help="AdamW learning rate"),
    lam: float = typer.Option(0.05, "--lam", help="λ on Σ(1 − TV(draft, ν)) per token"),
    init_w: float = typer.Option(0.5, "--init-w", help="the head's starting weight on the verifier, in (0, 1) "
                                 "(0.5: the authors'; near 1 when the ensemble at 0.5 never earns a reward)"),
    n_prompts: int = typer.Option(256, "--prompts", help="training prompts"),
    reward: str = typer.Option("exact", "--reward",
                               help="arithmetic: exact | exact+steps; addition (smollm2): exact | exact+sum"),
    max_new_tokens: int = typer.Option(96, "--max-new-tokens", help="rollout length cap"),
    temperature: float = typer.Option(0.0, "--temperature", help="the decoder temperature the head is for"),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option(None, "--device"),
    threads: int = typer.Option(1, "--threads", help="torch intra-op threads"),
) -> None:
    """Train w_t = head(h_draft, h_full) by REINFORCE on a sequence-level task reward; save safetensors + JSON."""
    from dimr.relaxed.diversed import TrainConfig
    from dimr.relaxed.train import train_for_pair

    if steps < 1 or batch < 1:
        raise DimrError("--steps and --batch must be at least 1")
    if not 0.0 < init_w < 1.0:
        raise DimrError(f"--init-w {init_w} must lie strictly between 0 and 1")
    _threads(threads)
    config = TrainConfig(steps=steps, batch=batch, lr=lr, lam=lam, init_w=init_w,
                         max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)

    def progress(step, log) -> None:
        console.print(f"step {step + 1}/{steps}  reward {log.rewards[-1]:.3f}  mean w {log.mean_w[-1]:.3f}  "
                      f"1−TV(draft, ν) {log.acceptance[-1]:.3f}", markup=False, highlight=False)

    _, log, path, by_type = train_for_pair(pair, task or None, out, config, n_prompts=n_prompts, device=device,
                                           progress=progress, reward_kind=reward)
    console.print(f"trained in {log.seconds:.0f}s; w on held-out rollouts by token type:", markup=False)
    for kind, d in by_type.items():
        console.print(f"  {kind:12s} n={d['n']:5d}  mean {d['mean']:.3f}  10/50/90% {d['q10']:.3f} / {d['q50']:.3f} / "
                      f"{d['q90']:.3f}", markup=False, highlight=False)
    console.print(f"saved {path} (+ {path.with_suffix('.json').name})", markup=False)


def _redo_groups(redo: str, resume: bool, works: list[str], drafters: list[str]) -> set[tuple[str, str]]:
    """The (workload, drafter) groups ``--redo`` names, checked against this run's workloads and drafters."""
    if not redo:
        return set()
    if not resume:
        raise DimrError("--redo re-decodes groups of a saved run: add --resume")
    groups = set()
    for item in (x.strip() for x in redo.split(",") if x.strip()):
        work, _, drafter = item.partition(":")
        if work not in works or drafter not in drafters:
            raise DimrError(f"--redo {item!r}: give WORKLOAD:DRAFTER with a workload of this run "
                            f"({', '.join(works)}) and one of its drafters ({', '.join(drafters)})")
        groups.add((work, drafter))
    return groups


def bench_relaxed(
    pair: str = typer.Option("mini", "--pair", help="model pair"),
    workloads: str = typer.Option("", "--workloads", help="the pair's workloads to run (default: all it has; "
                                  "mini: arithmetic,code; smollm2: instruct,task,code)"),
    methods: str = typer.Option("all", "--methods", help="comma-separated methods, or all"),
    drafters: str = typer.Option("model", "--drafter", help="model (the pair's draft), ngram (prompt lookup), or "
                                 "model,ngram"),
    gammas: str = typer.Option("3,5,8", "--gammas", help="draft lengths; the full sweep runs at --sweep-gamma"),
    sweep_gamma: str = typer.Option("5", "--sweep-gamma", help="γ at which every grid value runs, or best: the "
                                    "fastest lossless γ of --gammas, per workload and drafter"),
    grid_points: int = typer.Option(0, "--grid-points", help="values per method grid at --sweep-gamma (0 = all)"),
    gamma_methods: str = typer.Option("all", "--gamma-methods", help="methods to run at the other γ (or all)"),
    n_prompts: int = typer.Option(0, "--prompts", help="prompts per workload (0 = its default: 40, mini code 16)"),
    tokens: int = typer.Option(0, "--tokens", help="max new tokens per prompt for every workload (0 = defaults)"),
    n_arith: int = typer.Option(0, "--n-arith", help="held-out arithmetic problems (mini; 0 = --prompts)"),
    n_code: int = typer.Option(0, "--n-code", help="code prompts (0 = --prompts)"),
    arith_tokens: int = typer.Option(0, "--arith-tokens", help="max new tokens per arithmetic problem (0 = --tokens)"),
    code_tokens: int = typer.Option(0, "--code-tokens", help="max new tokens per code prompt (0 = --tokens)"),
    temperature: float = typer.Option(1.0, "--temperature", help="0 = greedy"),
    seed: int = typer.Option(0, "--seed"),
    head: Path = typer.Option(None, "--head", help="DIVERSED head (safetensors); without it diversed is skipped"),
    transfer: str = typer.Option("", "--transfer", help="SOURCE:TARGET[,…] or all: tune each method's value on "
                                 "SOURCE (fastest within tolerance of ar), report what it loses on TARGET"),
    costs_file: Path = typer.Option(None, "--costs", help="forward-cost table (`dimr bench-forward --json`); "
                                    "measured here, with each mode's step work, if absent (again on --resume)"),
    out_json: Path = typer.Option(None, "--json-out", help="write the rows as JSON (rewritten after every row)"),
    resume: bool = typer.Option(False, "--resume", help="continue the interrupted run in --json-out: its points "
                                "are kept, only the missing ones are decoded (same settings required)"),
    redo: str = typer.Option("", "--redo", help="with --resume: WORKLOAD:DRAFTER[,…] whose kept rows are decoded "
                             "again, in this process (rows of one process compare; another session's do not)"),
    plot: Path = typer.Option(None, "--plot", help="write the speed–quality PNG"),
    device: str = typer.Option(None, "--device"),
    threads: int = typer.Option(1, "--threads", help="torch intra-op threads"),
) -> None:
    """Sweep every relaxed rule's main parameter on the pair's held-out workloads; predictions beside measurements."""
    from dimr.decoding import DecodeConfig, Decoder
    from dimr.decoding.costs import Costs
    from dimr.relaxed import METHODS
    from dimr.relaxed import bench as rb
    from dimr.relaxed import transfer as rt
    from dimr.relaxed import workloads as rw
    from dimr.relaxed.diversed import load_head

    chosen = [m for m in METHODS if m != "lossless"] if methods == "all" else [
        m.strip() for m in methods.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METHODS or m == "lossless"]
    if unknown:
        raise DimrError(f"unknown method(s) {', '.join(unknown)}; use some of {', '.join(list(METHODS)[1:])}")
    works = rw.check_workloads(pair, [w.strip() for w in workloads.split(",") if w.strip()]
                               if workloads else list(rw.workloads_for(pair)))
    draft_list = [d.strip() for d in drafters.split(",") if d.strip()]
    if not draft_list or any(d not in rb.DRAFTERS for d in draft_list):
        raise DimrError(f"--drafter takes some of {', '.join(rb.DRAFTERS)} (comma-separated)")
    try:
        gamma_list = [int(g) for g in gammas.split(",") if g.strip()]
    except ValueError:
        raise DimrError("--gammas takes integers, e.g. 3,5,8") from None
    if not gamma_list or min(gamma_list) < 1:
        raise DimrError("--gammas takes positive integers, e.g. 3,5,8")
    if sweep_gamma != "best" and not sweep_gamma.isdigit():
        raise DimrError(f"--sweep-gamma {sweep_gamma!r}: give a draft length or best")
    grid_gamma = None if sweep_gamma == "best" else int(sweep_gamma)
    if min([n_prompts, tokens, n_arith, n_code, arith_tokens, code_tokens]) < 0:
        raise DimrError("--prompts, --tokens, --n-* and --*-tokens must be 0 (default) or positive")
    pairs = rt.parse_transfer(transfer, works) if transfer else []
    groups = _redo_groups(redo, resume, works, draft_list)
    saved, saved_meta = _saved_run(out_json, resume)
    saved = [r for r in saved if r.mode == "ar" or (r.workload, r.drafter) not in groups]
    loaded = [rw.load_workload(w, {"arithmetic": n_arith, "code": n_code}.get(w) or n_prompts or None,
                               {"arithmetic": arith_tokens, "code": code_tokens}.get(w) or tokens or None,
                               pair=pair) for w in works]
    meta = {"pair": pair, "temperature": temperature, "seed": seed, "gammas": gamma_list,
            "sweep_gamma": sweep_gamma if grid_gamma is None else grid_gamma,
            "workloads": {w.name: {"prompts": len(w.prompts), "max_new_tokens": w.max_new_tokens} for w in loaded},
            "drafters": draft_list, "n_arith": n_arith, "n_code": n_code, "head": str(head) if head else None}
    if saved_meta is not None:
        differs = rb.resume_mismatch(saved_meta, meta)
        if differs:
            raise DimrError(f"--resume: {out_json} was run with {differs}; rerun with its settings or give "
                            "another --json-out")
        meta["workloads"] = {**saved_meta.get("workloads", {}), **meta["workloads"]}
    costs = Costs.load(costs_file) if costs_file is not None else None
    _threads(threads)
    decoder = Decoder.load(pair, device=device)
    trained = load_head(head, decoder.draft.model, decoder.full.model)[0] if head is not None else None
    config = DecodeConfig(temperature=temperature, seed=seed, eos_token_ids=decoder.eos_token_ids())
    for note in rb.skipped(chosen, draft_list, trained):
        console.print(f"skipped: {note}", markup=False, highlight=False, soft_wrap=True)
    runs = 1 + sum(len(draft_list) * len(rb.sweep(m, gamma_list, grid_gamma or gamma_list[0], grid_points or None))
                   for m in chosen)
    budget = sum(w.max_new_tokens * len(w.prompts) for w in loaded) * runs
    kept_note = f"; {len(saved)} rows kept from {out_json}" if saved else ""
    console.print(f"plan: up to {runs} decodes of {' + '.join(f'{len(w.prompts)}×{w.max_new_tokens}' for w in loaded)}"
                  f" tokens (≤ {budget} tokens in all){kept_note}",
                  markup=False, highlight=False, soft_wrap=True)
    # Every process prices its own rows on a table it measures: the machine's speed moves between sessions.
    costs = costs or decoder.measure_costs(steps=("ar", *rb.DRAFTERS.values()), temperature=temperature)
    session = rb.new_session()
    meta["costs"] = (saved_meta or {}).get("costs") or costs.to_dict()  # the first process's (older rows')
    meta["tables"] = {**(saved_meta or {}).get("tables", {}), session: costs.to_dict()}
    finished: list = []
    kept_ids = {id(r) for r in saved}

    def progress(row) -> None:
        finished.append(row)
        if out_json is not None:
            done = {id(r) for r in finished}
            rb.save_json(finished + [r for r in saved if id(r) not in done], out_json, {**meta, "created": rb.now()})
        console.print(f"{row.workload:10s} {row.drafter if row.mode != 'ar' else '':5s} γ={row.gamma} "
                      f"{row.label:28s} speedup {row.speedup:5.2f} (cost model {row.cost_speedup:5.2f})  "
                      f"acc.len {row.accepted_length:5.2f} (pred {row.predicted_accepted_length:5.2f})  "
                      f"quality {rb.quality_of(row):7.3f}  out.len {row.output_length:5.1f}  rep4 {row.repetition:.2f}"
                      + ("  (kept)" if id(row) in kept_ids else ""),
                      markup=False, highlight=False, soft_wrap=True)

    try:
        rows = rb.run_bench(decoder, loaded, chosen, config, gamma_list, grid_gamma, trained, progress,
                            points=grid_points or None,
                            gamma_methods=None if gamma_methods == "all" else gamma_methods.split(","),
                            drafters=draft_list, costs=costs, saved=saved, session=session)
    except KeyboardInterrupt:
        where = (f"{len(finished)} rows in {out_json}; the same command with --resume goes on from there"
                 if out_json is not None else "nothing saved (no --json-out)")
        err_console.print(f"interrupted: {where}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    console.print(rb.format_table(rows), markup=False, highlight=False, soft_wrap=True)
    for note in rb.warnings(rows):
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    moved = [t for a, b in pairs for t in rt.transfers(rows, a, b)]
    if pairs:
        console.print(f"transfer (tuned: fastest with quality ≥ ar − tol, tol {rt.TOLERANCE}):", markup=False,
                      highlight=False)
        console.print(rt.format_transfers(moved), markup=False, highlight=False, soft_wrap=True)
    meta.update(transfer=[vars(t) for t in moved], created=rb.now())
    if out_json is not None:
        rb.save_json(rows, out_json, meta)
    if plot is not None:
        _, length = rb.plots(rows, plot, grid_gamma, f"{pair}, T={temperature:g}")
        console.print(f"wrote {plot} and {length}", markup=False)


def _saved_run(out_json: Path | None, resume: bool) -> tuple[list, dict | None]:
    """The rows and meta --resume continues; refuses to overwrite a finished or interrupted run without it."""
    from dimr.relaxed import bench as rb

    if out_json is None:
        if resume:
            raise DimrError("--resume continues the rows of --json-out FILE; give that file")
        return [], None
    if not resume:
        if out_json.exists():
            raise DimrError(f"{out_json} exists: add --resume to continue that run, or give another --json-out")
        return [], None
    if not out_json.is_file():
        raise DimrError(f"--resume: {out_json} does not exist; drop --resume to start a new run there")
    try:
        return rb.load_rows(out_json)
    except (ValueError, KeyError, TypeError):
        raise DimrError(f"--resume: {out_json} is not a bench-relaxed JSON file; give the file of the run to "
                        "continue") from None


def relaxed_methods(as_json: bool = typer.Option(False, "--json")) -> None:
    """List the relaxed verification rules, their main parameter, off value and sweep grid."""
    from dimr.relaxed import METHODS

    rows = [{"method": m.name, "param": m.param, "off": m.off, "grid": list(m.grid), "parameters": m.parameters
             if m.name != "lossless" else [], "summary": m.summary} for m in METHODS.values()]
    if as_json:
        print_json(rows)
        return
    for r in rows:
        console.print(f"{r['method']:12s} {r['param'] or '-':10s} off={r['off']!s:5s} grid={r['grid']}  "
                      f"{r['summary']}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.add_typer(diversed_app, name="diversed")
    app.command("bench-relaxed")(bench_relaxed)
    app.command("relaxed-methods")(relaxed_methods)
