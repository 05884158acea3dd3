"""The engine: admits requests, runs chunked prefill and batched decode / verify steps.

Each loop iteration runs at most one prefill chunk (of one request) and then one decode step over
every request that has finished its prefill, so running streams keep flowing while a long prompt is
prefilled (continuous batching of decode steps). A decode step feeds every request the same number
of query tokens: 1 (plain), the chain length, or the tree size, so its shapes are fixed.

Admission is SGLang's: first come, first served while the pool holds what every admitted request
needs through its next step plus ``new_token_ratio`` of its remaining output tokens (not its worst
case). When the running requests outgrow the pool, the youngest is retracted: its KV is freed and
it goes back to the front of the queue with its output so far, whose KV a later prefill recomputes
(all but the last token, as before the retraction) without emitting: the next decode or verify
step is then the one it left, so its outputs, greedy or seeded samples, stay an unretracted run's.

The engine runs in its own thread (``start``) or is stepped by the caller (``generate``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from decodecliff.kernels.api import AttentionBackend
from decodecliff.kernels.registry import get_backend

from .config import EngineConfig
from .graphs import GraphRunner
from .kv_pool import KVPool, PoolExhausted
from .model import StepInput, SyntheticMLA
from .request import Request, SamplingParams, TokenLogprob
from .spec import DraftTree, NgramDrafter, accept_chain, accept_tree

log = logging.getLogger("decodecliff.engine")


def sample(
    rows: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row of logits at the request's temperature, top_k and top_p."""
    logits = rows.float() / params.temperature
    probs = torch.softmax(logits, dim=-1)
    # Both filters read the whole distribution (SGLang's joint top_k / top_p): top_p's mass is
    # not that of the top_k tokens renormalized.
    if params.top_p < 1.0:
        probs = probs.masked_fill(~nucleus(probs, params.top_p), 0.0)
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]
        probs = probs.masked_fill(logits < kth, 0.0)
    if not torch.isfinite(probs).all():
        raise ValueError("the logits give no finite distribution")
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Per row, the tokens top_p keeps: those whose more likely tokens hold at most top_p.

    SGLang drops a token once the mass before it exceeds top_p, so one where it equals top_p
    stays; the most likely token always does."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    kept = sorted_p.cumsum(dim=-1) - sorted_p <= top_p
    return torch.empty_like(kept).scatter_(-1, order, kept)


def token_logprobs(rows: torch.Tensor, chosen: torch.Tensor, top: int) -> list[TokenLogprob]:
    """Per row: the chosen token's log-probability under the model and the `top` most likely."""
    lp = torch.log_softmax(rows.double(), dim=-1)
    picked = lp.gather(-1, chosen[:, None].long())[:, 0].tolist()
    alts = lp.topk(top, dim=-1) if top > 0 else None
    out: list[TokenLogprob] = []
    for r, value in enumerate(picked):
        pairs = []
        if alts is not None:
            pairs = list(zip(alts.indices[r].tolist(), alts.values[r].tolist(), strict=True))
        out.append((value, pairs))
    return out


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine for the server's self-description and metrics."""

    running: int  # requests in the running batch
    queued: int  # submitted and not yet admitted (retracted ones included)
    retractions: int  # running requests sent back to the queue to free the pool, since start
    used_tokens: int  # KV slots held by admitted requests (whole pages)
    max_total_tokens: int  # KV slots in the pool
    cuda_graphs_captured: list[list[int]]  # [batch size, query tokens] of each captured step
    fragmentation: dict  # Engine.fragmentation()
    kv_cache_bytes: int
    weight_bytes: int

    @property
    def token_usage(self) -> float:
        return self.used_tokens / self.max_total_tokens


class Engine:
    def __init__(self, cfg: EngineConfig) -> None:
        cfg.validate()
        self.cfg, self.mcfg = cfg, cfg.model
        self.device = torch.device(cfg.device)
        dtype = cfg.torch_dtype
        if cfg.threads is not None:
            # Process-wide; on a busy CPU one thread per process beats oversubscribed spinning.
            torch.set_num_threads(cfg.threads)
        self.model = SyntheticMLA(
            self.mcfg, self.device, dtype, cfg.seed, gemm=cfg.gemm,
            gemm_prefetch_mb=cfg.gemm_prefetch_mb, l2_overlap_mb=cfg.l2_overlap_mb,
        )  # fmt: skip
        self.backend = get_backend(cfg.backend, **cfg.backend_options)
        num_pages = self._num_pages(dtype)
        if why := self.backend.reach_problem(num_pages * cfg.page_size):  # before allocating it
            raise ValueError(f"KV pool of {num_pages * cfg.page_size} tokens: {why}")
        self.pool = KVPool(
            num_layers=self.mcfg.num_layers,
            num_pages=num_pages,
            page_size=cfg.page_size,
            row_dim=self.mcfg.kv_row_dim,
            max_requests=cfg.max_running_requests,
            dtype=dtype,
            device=self.device,
            scatter_seed=cfg.scatter_seed,
        )
        self.model.rope.reserve(self.pool.max_total_tokens)  # the cos/sin table, built once
        self.drafter = NgramDrafter()
        self.graphs = self.graph_runner() if cfg.cuda_graph else None
        self.inbox: queue.SimpleQueue[Request] = queue.SimpleQueue()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.steps = 0
        self.retractions = 0
        self.defrag_runs = 0
        self.defrag_pages_moved = 0
        self._request_no = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Held to queue a request and by the loop's last drain of the inbox, so no request lands
        # in it after; then why the loop ended.
        self._taking = threading.Lock()
        self._closed: str | None = None
        self.failed: BaseException | None = None

    # sizing ------------------------------------------------------------------------------------
    def _num_pages(self, dtype: torch.dtype) -> int:
        cfg = self.cfg
        per_token = KVPool.bytes_per_token(self.mcfg.num_layers, self.mcfg.kv_row_dim, dtype)
        if cfg.max_total_tokens is not None:
            tokens = cfg.max_total_tokens
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            tokens = int(free * cfg.mem_fraction) // per_token
        else:
            tokens = cfg.CPU_DEFAULT_TOKENS
        pages = tokens // cfg.page_size
        if pages < 1:
            raise ValueError(f"KV pool too small: {tokens} tokens for page size {cfg.page_size}")
        return pages

    @property
    def max_total_num_tokens(self) -> int:
        return self.pool.max_total_tokens

    @property
    def num_queued(self) -> int:
        """Requests submitted and not running (cheap: the server reads it per request)."""
        return len(self.waiting) + self.inbox.qsize()

    def stats(self) -> EngineStats:
        """What the engine holds right now (read-only: it changes nothing)."""
        pool = self.pool
        return EngineStats(
            running=len(self.running),
            queued=self.num_queued,
            retractions=self.retractions,
            used_tokens=(pool.num_pages - pool.allocator.num_free) * pool.page_size,
            max_total_tokens=pool.max_total_tokens,
            cuda_graphs_captured=self.graphs.captured_shapes() if self.graphs else [],
            fragmentation=self.fragmentation(),
            kv_cache_bytes=pool.cache.numel() * pool.cache.element_size(),
            weight_bytes=self.model.weight_bytes(),
        )

    def check(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise ValueError when a request can never be served by this engine."""
        vocab = self.mcfg.vocab_size
        if not prompt:
            raise ValueError("the prompt is empty")
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")
        need = params.needed_tokens(len(prompt), self.cfg.spec_tokens)
        if need > self.max_total_num_tokens:
            raise ValueError(
                # no parameter's name: the OpenAI routes call it max_tokens, /generate otherwise
                f"prompt ({len(prompt)} tokens) + {params.max_new_tokens} tokens to generate"
                + (
                    f" + draft tokens ({self.cfg.spec_tokens - 1})"
                    if self.cfg.spec != "none"
                    else ""
                )
                + f" exceeds max_total_num_tokens ({self.max_total_num_tokens})"
            )

    # threading ---------------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Queue a request; once the loop has stopped, end it at once (503), for nobody reads the
        inbox any more."""
        with self._taking:
            if self._closed is None:
                self.inbox.put(req)
                return
        req.finish_reason = {"type": "abort", "message": self._closed}
        req.error, req.status = self._closed, 503
        req.finished_at = time.perf_counter()
        req.on_update(req.snapshot())

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="decodecliff-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30) -> None:
        """Stop the loop; requests still queued or running end with "server shutting down"."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.failed is None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.step():
                    with contextlib.suppress(queue.Empty):
                        self.waiting.append(self.inbox.get(timeout=0.05))
        except BaseException as exc:  # keep the reason for /health
            self.failed = exc
            log.exception("engine loop died")
            self._abort_all(f"engine stopped: {exc}", 500)
        else:
            self._abort_all("server shutting down", 503)

    def _abort_all(self, reason: str, status: int) -> None:
        with self._taking, contextlib.suppress(queue.Empty):
            self._closed = reason
            while True:
                self.waiting.append(self.inbox.get_nowait())
        for req in list(self.running) + list(self.waiting):
            self._finish(req, abort=reason, status=status)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Request]:
        """Serve the prompts concurrently in the calling thread; returns the finished requests.

        Every prompt is checked before any is queued: a refused call leaves nothing behind."""
        reqs = [Request(prompt=list(p), params=params) for p in prompts]
        for req in reqs:
            self.check(req.prompt, params)
        self.waiting.extend(reqs)
        while any(r.finish_reason is None for r in reqs):
            self.step()
        return reqs

    # scheduling --------------------------------------------------------------------------------
    def step(self) -> bool:
        """One scheduling iteration; False when there was nothing to do."""
        while True:
            try:
                self.waiting.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        for req in [r for r in self.running + list(self.waiting) if r.cancelled]:
            self._finish(req, abort="cancelled by the client")
        while (
            self.waiting
            and len(self.running) < self.cfg.max_running_requests
            and self._fits(self.waiting[0])
        ):
            self._admit(self.waiting.popleft())
        if not self.running:
            return False
        prefilling = next((r for r in self.running if not r.prefill_done), None)
        if prefilling is not None and self._make_room([prefilling], self._chunk_end):
            self._guarded([prefilling], self._prefill_chunk, prefilling)
        decoding = [r for r in self.running if r.prefill_done and r.finish_reason is None]
        decoding = self._make_room(decoding, lambda r: r.kv_len + self.cfg.spec_tokens)
        if decoding:
            self._guarded(decoding, self._decode_step, decoding)
        self.steps += 1
        if self.cfg.defrag and self.steps % self.cfg.defrag_interval == 0:
            self.maybe_defrag()
        return True

    def _booked_tokens(self, req: Request) -> int:
        """KV slots admission books for a request: what it holds through its next decode or
        verify step (after its prefill: a prompt's emits a token, a retracted request's recompute
        does not, which this counts as if it did, a slot over), plus new_token_ratio of the
        output tokens left after that step. At ratio 1 this is its worst case, constant over its
        life."""
        if req.prefill_done:
            now, left = req.kv_len, req.params.max_new_tokens - len(req.output)
        else:
            now, left = len(req.tokens), req.params.max_new_tokens - len(req.output) - 1
        return now + self.cfg.spec_tokens + math.ceil(self.cfg.new_token_ratio * max(left, 0))

    def _fits(self, req: Request) -> bool:
        booked = sum(self.pool.pages_for(self._booked_tokens(r)) for r in self.running)
        return booked + self.pool.pages_for(self._booked_tokens(req)) <= self.pool.num_pages

    def _chunk_end(self, req: Request) -> int:
        """Where the request's next prefill chunk ends."""
        return min(req.prefilled + self.cfg.chunk_size, req.fill_len)

    def _make_room(self, reqs: list[Request], tokens: Callable[[Request], int]) -> list[Request]:
        """The requests of a step, once the pool can cover tokens(r) KV slots for each of them:
        until it can, the youngest running request (of the step or not) is retracted. The last
        running request is never retracted (check() made sure it fits the pool alone)."""
        while True:
            reqs = [r for r in reqs if r.row is not None]
            short = sum(self._pages_short(r, tokens(r)) for r in reqs)
            if short <= self.pool.allocator.num_free or len(self.running) <= 1:
                return reqs
            self._retract(max(self.running, key=lambda r: r.seq))

    def _pages_short(self, req: Request, tokens: int) -> int:
        return max(self.pool.pages_for(tokens) - len(self.pool.owners[req.row]), 0)

    def _retract(self, req: Request) -> None:
        """Free a running request's KV and queue it first, to be prefilled again with its output."""
        self.pool.close(req.row)
        req.row = None
        req.prefilled = req.kv_len = 0
        # The last output token's KV comes with the next step, as it would have: the prefill
        # then emits nothing, and the generator draws what the step it left would have drawn
        # (a verify step samples every query row, a prefill one token).
        req.fill_len = len(req.tokens) - 1 if req.output else len(req.tokens)
        req.retractions += 1
        self.retractions += 1
        self.running.remove(req)
        # Admission is first come, first served, so every waiting request is younger than every
        # running one; retracted youngest first, the queue stays in arrival order.
        self.waiting.appendleft(req)
        log.info("retracted %s (%d tokens) to free the KV pool", req.rid, len(req.tokens))

    def _admit(self, req: Request) -> None:
        req.row = self.pool.open()
        if req.retractions:  # readmitted: it keeps its drafter index and sampling generator
            self.running.append(req)
            return
        if self.cfg.spec != "none":
            req.drafter_state = self.drafter.new_state()
        if not req.params.greedy:
            seed = req.params.seed
            if seed is None:
                seed = self.cfg.seed + self._request_no
            req.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._request_no += 1
        self.running.append(req)

    def _guarded(self, reqs: list[Request], fn, *args) -> None:
        """Run a step; a failure ends only the requests in it, with their memory given back."""
        try:
            fn(*args)
        except torch.OutOfMemoryError as exc:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            for req in reqs:
                self._finish(req, abort=f"out of device memory: {exc}", status=503)
        except Exception as exc:  # a bug must not take the server down with it
            log.exception("step failed")
            for req in reqs:
                self._finish(req, abort=f"internal error: {exc!r}", status=500)

    def _finish(self, req: Request, abort: str | None = None, status: int = 200) -> None:
        if abort is not None and req.finish_reason is None:
            req.finish_reason = {"type": "abort", "message": abort}
            req.error, req.status = abort, status if status != 200 else 499
        req.finished_at = time.perf_counter()
        if req.row is not None:
            self.pool.close(req.row)
            req.row = None
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.on_update(req.snapshot())

    def _reserve(self, reqs: list[Request], extra: int) -> list[Request]:
        """Reserve cache for `extra` more tokens per request; requests that do not fit end (503)."""
        ok = []
        for req in reqs:
            try:
                self.pool.reserve(req.row, req.kv_len + extra)
                ok.append(req)
            except PoolExhausted as exc:
                self._finish(req, abort=str(exc), status=503)
        return ok

    # emitting tokens ---------------------------------------------------------------------------
    def _emit(
        self, req: Request, tokens: list[int], rows: list[int] | None = None, verify: bool = False
    ) -> None:
        """Append tokens (the target's choices at query rows `rows`, default 0, 1, ...).

        With verify they come from a verify step and count as its accepted tokens, as far as they
        are kept: those after a stop or the length limit are dropped and not counted."""
        params, eos = req.params, self.mcfg.eos_token_id
        rows = list(range(len(tokens))) if rows is None else rows
        for tok, row in zip(tokens, rows, strict=True):
            req.tokens.append(tok)
            if verify:
                req.accepted += 1
            if params.logprobs is not None:
                req.logprobs.append(req.row_logprobs[row])
            # SGLang's order: the length limit, then stop tokens (off with ignore_eos), then stop
            # sequences, so a stop token that is the last one allowed ends with "length".
            if len(req.tokens) - len(req.prompt) >= params.max_new_tokens:
                req.finish_reason = {"type": "length", "length": params.max_new_tokens}
            elif not params.ignore_eos and (tok == eos or tok in params.stop_token_ids):
                req.finish_reason = {"type": "stop", "matched": tok}
            elif (seq := self._stop_match(req)) is not None:
                req.finish_reason = {"type": "stop", "matched": list(seq)}
            if req.finish_reason is not None:
                self._finish(req)
                return
        req.on_update(req.snapshot())

    @staticmethod
    def _stop_match(req: Request) -> tuple[int, ...] | None:
        out = len(req.tokens) - len(req.prompt)
        for seq in req.params.stop_sequences:
            if len(seq) <= out and tuple(req.tokens[-len(seq) :]) == seq:
                return seq
        return None

    def _targets(
        self, reqs: list[Request], counts: list[int], logits: torch.Tensor
    ) -> list[list[int] | None]:
        """The target's token at every query row: argmax, or a seeded sample.

        A request whose sampling fails ends alone (500) and gets None; the others go on.
        """
        chosen = logits.argmax(dim=-1)
        start, failed = 0, set()
        for i, (req, n) in enumerate(zip(reqs, counts, strict=True)):
            rows = logits[start : start + n]
            try:
                if not req.params.greedy:
                    chosen[start : start + n] = sample(rows, req.params, req.generator)
                if req.params.logprobs is not None:
                    req.row_logprobs = token_logprobs(
                        rows, chosen[start : start + n], req.params.logprobs
                    )
            except Exception as exc:  # bad logits or parameters: this request only
                log.exception("sampling failed for %s", req.rid)
                self._finish(req, abort=f"sampling failed: {exc!r}", status=500)
                failed.add(i)
            start += n
        flat = chosen.tolist()
        out: list[list[int] | None] = []
        start = 0
        for i, n in enumerate(counts):
            out.append(None if i in failed else flat[start : start + n])
            start += n
        return out

    # forward passes ----------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def build_step(
        self,
        reqs: list[Request],
        tokens: list[list[int]],
        offsets: list[list[int]],
        tree_mask: torch.Tensor | None,
        logit_rows: list[int] | None,
        mha: bool = False,
    ) -> StepInput:
        """Inputs for tokens[b] of request b at positions kv_len + offsets[b][i].

        The tokens take the request's next cache slots kv_len .. kv_len + len(tokens[b]) - 1.
        With mha the step attends through decompressed multi-head attention (prefill only).
        """
        dev, pool = self.device, self.pool
        ids, pos, slots, kv_lens, indptr = [], [], [], [], [0]
        for req, toks, offs in zip(reqs, tokens, offsets, strict=True):
            ids += toks
            pos += [req.kv_len + o for o in offs]
            slots += pool.slots(req.row, req.kv_len, req.kv_len + len(toks))
            kv_lens.append(req.kv_len + len(toks))
            indptr.append(indptr[-1] + len(toks))
        max_pages = pool.pages_for(max(kv_lens))
        rows = [r.row for r in reqs]
        if rows == list(range(rows[0], rows[0] + len(rows))):
            # consecutive rows (always so for one request): a view, no copy of a long table
            page_table = pool.req_to_page[rows[0] : rows[0] + len(rows), :max_pages]
        else:
            page_table = pool.req_to_page[torch.tensor(rows, device=dev), :max_pages]
        as_long = lambda xs: torch.tensor(xs, dtype=torch.long).to(dev)  # noqa: E731
        as_int = lambda xs: torch.tensor(xs, dtype=torch.int32).to(dev)  # noqa: E731
        return StepInput(
            input_ids=as_long(ids),
            positions=as_long(pos),
            out_slots=as_long(slots),
            page_table=page_table,
            kv_lens=as_int(kv_lens),
            q_indptr=as_int(indptr),
            tree_mask=None if tree_mask is None else tree_mask.to(dev),
            max_q_len=max(len(t) for t in tokens),
            max_kv_len=max(kv_lens),
            total_kv_len=sum(kv_lens),
            logit_rows=None if logit_rows is None else as_long(logit_rows),
            mha=mha,
        )

    def graph_runner(self, backend: AttentionBackend | None = None) -> GraphRunner:
        """CUDA graphs of this engine's decode/verify step (with ``backend``, default its own).

        A backend that plans on the host is planned before every replay, outside the graph, as
        SGLang replays FlashInfer's and its Triton backend's metadata."""
        backend = backend or self.backend
        cache = self.pool.cache

        def forward(step: StepInput, planned: bool = False) -> torch.Tensor:
            return self.model.forward(step, cache, backend, planned=planned)

        def plan(step: StepInput) -> None:
            self.model.plan(step, cache, backend)

        return GraphRunner(
            forward,
            plan=plan if backend.plan_outside_graph else None,
            max_batch=self.cfg.max_running_requests,
            q_len=self.cfg.spec_tokens,
            max_pages=self.pool.max_pages_per_req,
            max_kv_len=self.pool.max_total_tokens,
            tree=self.cfg.spec == "tree",
            device=self.device,
            capturable=backend.capturable,
        )

    def forward(self, step: StepInput, decode: bool = False) -> torch.Tensor:
        if decode and self.graphs is not None:
            return self.graphs.forward(step)
        return self.model.forward(step, self.pool.cache, self.backend)

    def _prefill_chunk(self, req: Request) -> None:
        start, end = req.prefilled, self._chunk_end(req)
        if not self._reserve([req], end - start):
            return
        n = end - start
        mha = self.cfg.prefill_attention == "mha"  # then the backend never sees a prefill chunk
        step = self.build_step([req], [req.tokens[start:end]], [list(range(n))], None, [n - 1], mha)
        self._sync()
        t0 = time.perf_counter()
        logits = self.forward(step)
        # Only a prompt's prefill emits; a retracted request's resumes with its next step.
        emits = end == len(req.tokens)
        target = self._targets([req], [1], logits)[0] if emits else None
        self._sync()
        req.prefill_ms += (time.perf_counter() - t0) * 1e3
        if emits and target is None:
            return  # sampling failed; the request has ended
        req.prefilled = req.kv_len = end
        if req.drafter_state is not None:
            # Index the prompt chunk by chunk, so no verify step pays for the whole context.
            self.drafter.observe(req.drafter_state, req.tokens, end)
        if emits:
            self._emit(req, target)

    def _decode_step(self, reqs: list[Request]) -> None:
        q = self.cfg.spec_tokens
        reqs = self._reserve(reqs, q)
        if not reqs:
            return
        trees: list[DraftTree] = []
        if self.cfg.spec == "none":
            tokens = [[r.tokens[-1]] for r in reqs]
            offsets = [[0]] * len(reqs)
        elif self.cfg.spec == "chain":
            tokens = [
                [r.tokens[-1]] + self.drafter.draft_chain(r.drafter_state, r.tokens, q - 1)
                for r in reqs
            ]
            offsets = [list(range(q))] * len(reqs)
        else:
            trees = [self.drafter.draft_tree(r.drafter_state, r.tokens, q) for r in reqs]
            tokens = [t.tokens for t in trees]
            offsets = [t.depths() for t in trees]
        mask = torch.stack([t.ancestor_mask() for t in trees]) if trees else None
        step = self.build_step(reqs, tokens, offsets, mask, None)
        self._sync()
        t0 = time.perf_counter()
        logits = self.forward(step, decode=True)
        targets = self._targets(reqs, [q] * len(reqs), logits)
        self._sync()
        ms = (time.perf_counter() - t0) * 1e3
        for i, req in enumerate(reqs):
            if targets[i] is None:
                continue  # its sampling failed and it has ended
            req.decode_ms.append(ms)
            if self.cfg.spec == "none":
                req.kv_len += 1
                self._emit(req, targets[i])
                continue
            path = None  # query rows of the emitted tokens (a chain's are 0, 1, ...)
            if self.cfg.spec == "chain":
                emitted = accept_chain(tokens[i][1:], targets[i])
            else:
                path, emitted = accept_tree(trees[i], targets[i])
                self._compact_path(req, path)
            req.verify_ms.append(ms)
            req.kv_len += len(emitted)  # the last token and the accepted drafts
            self.pool.truncate(req.row, req.kv_len)
            self._emit(req, emitted, path, verify=True)

    def _compact_path(self, req: Request, path: list[int]) -> None:
        """Move the accepted tree nodes' KV to consecutive slots right after the prefix."""
        moves = [(node, i) for i, node in enumerate(path) if node != i]
        if not moves:
            return
        slot = lambda i: self.pool.slots(req.row, req.kv_len + i, req.kv_len + i + 1)[0]  # noqa: E731
        self.pool.move_rows([slot(s) for s, _ in moves], [slot(d) for _, d in moves])

    # defragmentation ---------------------------------------------------------------------------
    def fragmentation(self) -> dict:
        info = self.pool.fragmentation()
        info.update(defrag_runs=self.defrag_runs, defrag_pages_moved=self.defrag_pages_moved)
        return info

    def maybe_defrag(self, force: bool = False) -> int:
        """Compact every running request's pages when fragmentation passes the threshold."""
        frag = self.pool.fragmentation()["request_fragmentation"]
        if not force and frag <= self.cfg.defrag_threshold:
            return 0
        self._sync()
        moved = self.pool.defragment()
        self.defrag_runs += 1
        self.defrag_pages_moved += moved
        return moved
