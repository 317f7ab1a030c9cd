"""Requests over MQTT: parse, price, answer (docs/mqtt.md).

Each request runs as a task of its own, at most MAX_CONCURRENT_REQUESTS at a time; beyond
MAX_PENDING_REQUESTS in hand, a request is answered `busy` at once and nothing of it is kept. A request that
fails for any reason gets an error answer, and the others go on.

Each request comes from an owner (agent/topics.py: the client scope it was sent under, "" for the shared
topics). With `[privacy]` on (the default) a request that tells of the device's speed takes from its owner's
budget (agent/ratelimit.py), and is answered at the held speed through the owner's jittered boundaries
(monitors/privacy.py); monitors requests act on the owner's own monitors only (agent/registry.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import aiomqtt

from agent import heap
from agent.analysis import Analysis, AnalysisPool, EngineError
from agent.config import Config
from agent.policy import PolicyGate
from agent.protocol import (
    METHODS,
    Request,
    error,
    ok,
    parse_request,
    parse_request_compact,
    transaction_of,
    with_payload,
)
from agent.ratelimit import PRICED_METHODS, ClientBudgets, RateLimited
from agent.registry import MonitorRegistry
from agent.topics import Topics
from monitors.errors import BadInput
from monitors.placement import place
from monitors.privacy import Warp, held_speed, period_of, warp_for
from monitors.speed.present import PresentSpeed, Speed, fastest, memory_shortfall
from monitors.table import Member, initial_answer

log = logging.getLogger("daop-agent")

MAX_CONCURRENT_REQUESTS = 64
MAX_PENDING_REQUESTS = 2000  # beyond this many requests in hand, answer 'busy' at once
CALIBRATION_WAIT_S = 180.0
TRANSACTION_SCAN_BYTES = 65536  # a flood's transaction ids are looked for in small payloads only
OFFLOOP_PARSE_BYTES = 256 * 1024  # larger request payloads are read in a worker process

Route = tuple[str | None, Any]  # a request's v5 ResponseTopic and CorrelationData (None: absent)

Answer = Callable[[str, bytes, Any], Awaitable[None]]  # (topic, payload, correlation data)


class RequestHandler:
    """Answers a device's requests: priced at the present speed, under the policy's latest verdict."""

    def __init__(self, cfg: Config, topics: Topics, registry: MonitorRegistry, pool: AnalysisPool,
                 speed: PresentSpeed, policy: PolicyGate, answer: Answer,
                 observe: Callable[[str, str, float], None] | None = None) -> None:
        """`observe`: told each request's method, outcome ("ok" or the error code) and seconds (the metrics)."""
        self.cfg = cfg
        self.topics = topics
        self.registry = registry
        self.pool = pool
        self.speed = speed
        self.policy = policy
        self._answer = answer
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_REQUESTS)
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending_bytes = 0  # payload bytes of the requests in hand
        self.observe = observe
        privacy = cfg.privacy
        self.budgets = ClientBudgets(privacy.burst, privacy.per_minute, privacy.max_clients) \
            if privacy.enabled else None
        self._secret = secrets.token_bytes(32)  # the jitter's key: this run's, never sent
        self._held: Speed | None = None  # the slow-down answers are priced at (monitors/privacy.py: held_speed)

    def receive(self, method: str, message: aiomqtt.Message, owner: str = "") -> None:
        """A request from the broker (on the event loop), from `owner`: handled in a task of its own. A retained
        request is dropped (it would run again after every reconnect); one over `max_request_bytes`, from an owner
        whose budget is spent, or beyond what the agent holds at once (`max_pending_bytes`,
        MAX_PENDING_REQUESTS), is answered at once and not kept: nothing of its payload is read."""
        payload = message.payload if isinstance(message.payload, bytes) else str(message.payload).encode()
        route = _route(message)
        if message.retain:
            log.warning("ignored a retained request on request/%s: requests are never kept", _printable(method))
            self._observed(method, "retained", time.monotonic())
            return
        size, limits = len(payload), self.cfg.limits
        if size > limits.max_request_bytes:
            self._answer_now(method, route, "too_large", f"request is {size} bytes, more than the limit of "
                             f"{limits.max_request_bytes}", None, owner)
            return
        if self.budgets is not None and method in PRICED_METHODS:
            try:  # before anything of the payload is read: an over-budget client costs no parsing
                self.budgets.check(owner, time.monotonic())
            except RateLimited as exc:
                transaction = transaction_of(payload) if size <= TRANSACTION_SCAN_BYTES else None
                self._answer_now(method, route, exc.code, str(exc), transaction, owner, exc.retry_after_s)
                return
        if len(self.tasks) >= MAX_PENDING_REQUESTS or self.pending_bytes + size > limits.max_pending_bytes:
            transaction = transaction_of(payload) if size <= TRANSACTION_SCAN_BYTES else None
            self._answer_now(method, route, "busy", "too many requests in hand; retry later", transaction, owner)
            return
        self.pending_bytes += size
        self._spawn(self._handle(method, route, payload, owner))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _answer_now(self, method: str, route: Route, code: str, message: str, transaction: Any, owner: str,
                    retry_after_s: int | None = None) -> None:
        """An error answer without keeping the request (a task holds only the answer)."""
        answer = error(code, message, transaction, retry_after_s)
        self._spawn(self._reply(method, route, answer, owner))
        self._observed(method, code, time.monotonic())

    async def _handle(self, method: str, route: Route, payload: bytes, owner: str) -> None:
        started = time.monotonic()
        size = len(payload)
        try:
            async with self._slots:
                transaction = None
                outcome = "ok"
                try:
                    request = await self._parse(method, payload)
                    transaction = request.transaction
                    if self.budgets is not None and method in PRICED_METHODS:
                        self.budgets.take(owner, time.monotonic())
                    answer = ok(await self.dispatch(request, owner), transaction)
                except BadInput as exc:
                    if transaction is None and len(payload) <= TRANSACTION_SCAN_BYTES:
                        transaction = transaction_of(payload)
                    retry = exc.retry_after_s if isinstance(exc, RateLimited) else None
                    answer, outcome = error(exc.code, str(exc), transaction, retry), exc.code
                except EngineError as exc:
                    answer, outcome = error("estimator_error", str(exc), transaction), "estimator_error"
                except Exception:
                    log.exception("request %s failed", _printable(method))
                    answer, outcome = error("internal", "internal error; see the agent's log", transaction), "internal"
                del payload
                await self._reply(method, route, answer, owner)
                self._observed(method, outcome, started)
        finally:
            self.pending_bytes -= size
            if size > OFFLOOP_PARSE_BYTES:
                heap.trim()  # what the large request took goes back (agent/heap.py)

    async def _parse(self, method: str, payload: bytes) -> Request:
        """A small request is read here; a large one in a worker (its JSON and base64 take the loop for long,
        and memory a multiple of its size), where the worker's memory ceiling and time limit bound it."""
        if len(payload) <= OFFLOOP_PARSE_BYTES or method not in METHODS:
            return parse_request(method, payload, self.cfg.limits.max_request_bytes)
        await self.pool.wait_ready(CALIBRATION_WAIT_S)
        request: Request = await self.pool.parse(parse_request_compact, method, payload,
                                                 self.cfg.limits.max_request_bytes)
        return with_payload(request, payload)

    def _observed(self, method: str, outcome: str, started: float) -> None:
        if self.observe is not None:  # an unknown method is counted under one name: topics are the requester's
            self.observe(method if method in METHODS else "unknown", outcome, time.monotonic() - started)

    async def _reply(self, method: str, route: Route, answer: bytes, owner: str) -> None:
        response_topic, correlation = route
        topic = self.topics.answer_topic(method, response_topic, owner)
        if topic is not None:
            await self._answer(topic, answer, correlation)

    def _priced(self, owner: str) -> tuple[Speed, Warp]:
        """The speed an owner's answer is priced at, and the owner's view of the boundaries (monitors/privacy.py);
        the live speed and the contract's boundaries with `[privacy]` off."""
        privacy = self.cfg.privacy
        if not privacy.enabled:
            return self.speed.speed, Warp()
        self._held = held_speed(self._held, self.speed.speed, privacy.rules.hysteresis)
        return self._held, warp_for(self._secret, owner, period_of(time.time(), privacy.rules), privacy.rules)

    async def _analyses(self, request: Request) -> list[Analysis]:
        """Each workload's graph imported and priced in the workers, together."""
        await self.pool.wait_ready(CALIBRATION_WAIT_S)
        analyses = list(await asyncio.gather(*(
            self.pool.analyse(w.model.fmt, w.model.source, w.inputs, self.cfg.limits.graph, w.generation)
            for w in request.workloads)))
        for w, a in zip(request.workloads, analyses, strict=True):
            for device in a.base_ms:
                why = memory_shortfall(a.memory_bytes, self.speed.speed, device)
                if why is not None:
                    log.info("%s cannot run on the %s now: %s", f"workload {w.name!r}" if w.name else "a model",
                             device, why)
        return analyses

    def _placed(self, request: Request, analyses: list[Analysis]) -> list[Analysis]:
        """The analyses with only the devices the request's WebNN context options place it on."""
        if request.context is None:
            return analyses
        state = self.speed.state
        try:
            placement = place(request.context, state.accelerators if state is not None else (),
                              self.pool.facts.providers)
        except BadInput as exc:
            raise BadInput(str(exc), "bad_context") from None
        for note in placement.notes:
            log.info("placement: %s", note)
        if placement.device == "auto":
            return analyses
        if any(placement.device not in a.base_ms for a in analyses):
            raise BadInput(f"no calibration for the {placement.device} here", "bad_context")
        return [dataclasses.replace(a, base_ms={placement.device: a.base_ms[placement.device]}) for a in analyses]

    async def dispatch(self, request: Request, owner: str = "") -> dict[str, Any]:
        method = request.method
        if method == "estimate":
            (analysis,) = self._placed(request, await self._analyses(request))
            speed, warp = self._priced(owner)
            latency, device = analysis.present(speed)
            answer = {"performanceTier": warp.tier(latency)}
            if analysis.phases:
                answer |= self._phase_tiers(analysis, device, math.isfinite(latency), speed, warp)
            return answer
        if method == "meets":
            return self._meets(request, self._placed(request, await self._analyses(request)), owner)
        if method == "monitors/create":
            return await self._create(request, owner)
        if method == "monitors/delete":
            assert request.monitor is not None
            await self.registry.delete(request.monitor, owner)
            log.info("monitor %s deleted", request.monitor)
            return {}
        if method == "monitors/list":
            return {"monitors": self.registry.listing(owner)}
        if method == "monitors/renew":
            renewed, unknown = self.registry.book.renew(request.monitors, owner, time.monotonic())
            log.debug("lease renewed: %d monitor(s); %d unknown", len(renewed), len(unknown))
            return {"renewed": renewed, "unknown": unknown}
        if method == "monitors/running":
            assert request.monitor is not None and request.running is not None
            await self.registry.set_running(request.monitor, request.running, owner)
            log.info("monitor %s: its app %s", request.monitor,
                     f"runs it here now{f' at {request.running.rate_hz:g} Hz' if request.running.rate_hz else ''}"
                     f"{f' (process {request.running.pid})' if request.running.pid else ''}"
                     if request.running.running else "no longer runs it here")
            return {"monitor": request.monitor, "running": request.running.running}
        if method == "monitors/report":
            assert request.monitor is not None
            self.registry.report(request.monitor, request.workload, request.latencies_ms, time.time(), owner)
            return {}
        raise BadInput(f"unknown method {method!r}", "unknown_method")

    def _phase_tiers(self, analysis: Analysis, device: str, fits: bool, speed: Speed, warp: Warp) -> dict[str, str]:
        """A generation's time to first token and time per output token now, as tiers."""
        ttft, tpot = analysis.phases[device]
        prefill_mb, step_mb = analysis.phase_written_mb if device == "cpu" else (0.0, 0.0)
        prefill_stream, step_stream = analysis.phase_stream_ms if device == "cpu" else (0.0, 0.0)
        prefill_gemm, step_gemm = analysis.phase_gemm_ms if device == "cpu" else (0.0, 0.0)

        def now(base_ms: float, written_mb: float, stream_ms: float, gemm_ms: float) -> str:
            return warp.tier(fastest({device: base_ms}, speed, 0, written_mb, stream_ms, gemm_ms)[0] if fits
                             else math.inf)

        return {"timeToFirstTokenTier": now(ttft, prefill_mb, prefill_stream, prefill_gemm),
                "timePerOutputTokenTier": now(tpot, step_mb, step_stream, step_gemm)}

    def _meets(self, request: Request, analyses: list[Analysis], owner: str) -> dict[str, Any]:
        members, latencies = [], []
        speed, warp = self._priced(owner)
        for w, a in zip(request.workloads, analyses, strict=True):
            assert w.requirement is not None
            latency, device = a.present(speed)
            members.append(Member(a.base_ms[device], device, w.requirement.deadline_ms, w.requirement.sustained_hz))
            latencies.append(warp.shown_ms(latency))
        meets, member_meets = initial_answer(latencies, members, self.policy.vetoed is not None)
        out: dict[str, Any] = {"meetsRequirement": meets}
        if request.group:
            out["workloads"] = {w.name: ok for w, ok in zip(request.workloads, member_meets, strict=True)}
        return out

    async def _create(self, request: Request, owner: str) -> dict[str, Any]:
        monitor = request.monitor or secrets.token_hex(8)
        self.registry.book.check_owner(monitor, owner)  # before the work of pricing it
        self.registry.book.check_room(monitor, owner)
        analyses = self._placed(request, await self._analyses(request))
        workloads = []
        for w, a in zip(request.workloads, analyses, strict=True):
            assert w.requirement is not None
            workloads.append((w.name, w.requirement, a))
        speed, warp = self._priced(owner)
        meets, answers, replaced = await self.registry.create(monitor, workloads, speed, self.policy.vetoed is not None,
                                                              owner, warp.shown_ms, request.lease_s)
        log.info("monitor %s created (%s)%s", monitor,
                 ", ".join(f"{w.name + ': ' if w.name else ''}{w.requirement.describe()}" for w in request.workloads
                           if w.requirement is not None),
                 " replacing the previous one" if replaced else "")
        out: dict[str, Any] = {"monitor": monitor, "meetsRequirement": meets}
        if answers is not None:
            out["workloads"] = answers
        return out


def _route(message: aiomqtt.Message) -> Route:
    props = message.properties
    if props is None:
        return None, None
    return getattr(props, "ResponseTopic", None), getattr(props, "CorrelationData", None)


def _printable(method: str) -> str:
    """A requester's topic suffix, safe and short for a log line."""
    text = method.encode("ascii", "backslashreplace").decode()
    return text if len(text) <= 80 else text[:77] + "..."
