"""The compiled purgatory and the pure-Python reference, driven by the same random steps, agree.

As ``test_paths_agree`` does for the timers: ``tickwheel`` is the package as
installed (compiled when the extension was built) and ``load_pure()`` an
independent copy on the pure path. Both run a purgatory in deterministic mode
(a ``ManualClock`` timer with the inline executor, no reaper) through the same
steps; every return value, every op's events and state, every counter, the
watched counts and the watched keys must be identical after each step.
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tickwheel
from support.paths import load_pure

pytestmark = pytest.mark.skipif(
    not tickwheel.COMPILED, reason="the compiled core is not built: only one path to test"
)

PURE = load_pure()

_KEYS = ["a", "b", "c", ("t", 0), 5, -1]

_steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("open"),
            st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3),
            st.integers(-5, 300),
            st.booleans(),  # completable at once
            st.sampled_from(
                [
                    "plain",
                    "shared-lock",
                    "custom-force",
                    "custom-or-else",
                    "custom-cancel",
                    "instance-hooks",
                ]
            ),
        ),
        st.tuples(st.just("signal"), st.sampled_from(_KEYS)),
        st.tuples(st.just("check"), st.sampled_from(_KEYS)),
        st.tuples(st.just("force"), st.integers(0, 100)),
        st.tuples(st.just("safe_try"), st.integers(0, 100)),
        st.tuples(st.just("run"), st.integers(0, 100)),
        st.tuples(st.just("cancel_task"), st.integers(0, 100)),
        st.tuples(st.just("cancel_for_key"), st.sampled_from(_KEYS)),
        st.tuples(st.just("advance"), st.integers(0, 120)),
        st.tuples(st.just("purge")),
    ),
    max_size=70,
)


class _Driver:
    """One path's purgatory in deterministic mode, logging everything it returns and runs."""

    def __init__(self, pkg: ModuleType, tick_ms: int, purge_interval: int) -> None:
        self.clock = pkg.ManualClock(0)
        self.timer = pkg.SystemTimer("agree", tick_ms=tick_ms, clock=self.clock, executor="inline")
        self.purgatory = pkg.DelayedOperationPurgatory(
            "agree", timer=self.timer, purge_interval=purge_interval, reaper_enabled=False
        )
        self.shared = threading.RLock()
        self.ops: list[Any] = []
        self.log: list[tuple[Any, ...]] = []
        log = self.log

        class Op(pkg.DelayedOperation):  # type: ignore[name-defined, misc]
            __slots__ = ("completable", "n")

            def __init__(self, n: int, delay_ms: int, lock: Any) -> None:
                super().__init__(delay_ms, lock)
                self.n = n
                self.completable = False

            def try_complete(self) -> bool:
                log.append(("try", self.n))
                return self.force_complete() if self.completable else False

            def on_complete(self) -> None:
                log.append(("complete", self.n))

            def on_expiration(self) -> None:
                log.append(("expire", self.n))

        class CustomForce(Op):
            __slots__ = ()

            def force_complete(self) -> bool:
                log.append(("force", self.n))
                return bool(super().force_complete())

        class CustomOrElse(Op):
            __slots__ = ()

            def safe_try_complete_or_else(self, action: Any) -> bool:
                log.append(("or-else", self.n))
                return bool(super().safe_try_complete_or_else(action))

        class CustomCancel(Op):
            __slots__ = ()

            def cancel(self) -> bool:
                log.append(("cancel", self.n))
                return bool(super().cancel())

        class WithDict(Op):
            """No __slots__: the op has a __dict__, and methods set on the instance win."""

        self.kinds = {
            "plain": Op,
            "shared-lock": Op,
            "custom-force": CustomForce,
            "custom-or-else": CustomOrElse,
            "custom-cancel": CustomCancel,
            "instance-hooks": WithDict,
        }

    def _hook(self, op: Any, name: str) -> None:
        """Set on ``op`` a logging wrapper of its method ``name``."""
        method = getattr(op, name)

        def hooked(*args: Any) -> Any:
            self.log.append((name, op.n))
            return method(*args)

        setattr(op, name, hooked)

    def _op(self, index: int) -> Any:
        return self.ops[index % len(self.ops)] if self.ops else None

    def step(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        purgatory = self.purgatory
        if kind == "open":
            _, keys, delay, ready, op_kind = step
            lock = self.shared if op_kind == "shared-lock" else None
            op = self.kinds[op_kind](len(self.ops), delay, lock)
            op.completable = ready
            if op_kind == "instance-hooks":
                self._hook(op, "cancel")
                self._hook(op, "safe_try_complete_or_else")
                self._hook(op, "safe_try_complete")
            self.ops.append(op)
            self.log.append(("watch", purgatory.try_complete_else_watch(op, keys)))
        elif kind == "signal":
            for op in self.ops:
                op.completable = True
            self.log.append(("checked", purgatory.check_and_complete(step[1])))
        elif kind == "check":
            self.log.append(("checked", purgatory.check_and_complete(step[1])))
        elif kind == "cancel_for_key":
            cancelled = purgatory.cancel_for_key(step[1])
            self.log.append(("cancelled", [op.n for op in cancelled]))
        elif kind == "advance":
            self.clock.advance(step[1])
            self.log.append(("advanced", purgatory.advance_clock(0)))
        elif kind == "purge":
            self.log.append(("purged", purgatory.purge_completed()))
        elif self.ops:
            op = self._op(step[1])
            if kind == "force":
                self.log.append(("forced", op.force_complete()))
            elif kind == "safe_try":
                self.log.append(("safe", op.safe_try_complete()))
            elif kind == "run":
                op.run()
            else:
                self.log.append(("task-cancel", op.cancel()))
        self.log.append(
            (
                "counters",
                purgatory.num_completed,
                purgatory.num_expired,
                purgatory.num_cancelled,
                purgatory.num_purged,
                purgatory.num_delayed,
                purgatory.watched,
                purgatory.watched_keys(),
            )
        )
        self.log.append(
            (
                "ops",
                [(op.is_completed, op.is_cancelled, op.is_pending, repr(op)) for op in self.ops],
            )
        )
        self.timer._check()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tick_ms=st.sampled_from([1, 3, 10]),
    purge_interval=st.sampled_from([0, 2, 1000]),
    steps=_steps,
)
def test_purgatories_agree(tick_ms: int, purge_interval: int, steps: list[tuple[Any, ...]]) -> None:
    compiled = _Driver(tickwheel, tick_ms, purge_interval)
    pure = _Driver(PURE, tick_ms, purge_interval)
    assert type(compiled.purgatory).__mro__[1].__module__ == "tickwheel._speedups"
    assert type(pure.purgatory).__mro__[1].__module__ == "tickwheel._purgatory"
    for step in steps:
        compiled.step(step)
        pure.step(step)
        assert compiled.log == pure.log, step
    # Expire whatever is left: the same ops expire, in the same order.
    for driver in (compiled, pure):
        driver.clock.advance(10**6)
        driver.purgatory.advance_clock(0)
        driver.log.append(("end", driver.purgatory.purge_completed(), driver.purgatory.watched))
        driver.purgatory.shutdown()
    assert compiled.log == pure.log


def test_bad_input_is_refused_alike() -> None:
    def errors(pkg: ModuleType) -> list[str]:
        class Op(pkg.DelayedOperation):  # type: ignore[name-defined, misc]
            __slots__ = ()

            def try_complete(self) -> bool:
                return False

            def on_complete(self) -> None:
                pass

        timer = pkg.SystemTimer(clock=pkg.ManualClock(0), executor="inline")
        purgatory = pkg.DelayedOperationPurgatory("bad", timer=timer, reaper_enabled=False)
        seen = []
        for call in (
            lambda: purgatory.try_complete_else_watch(Op(5), []),
            lambda: purgatory.try_complete_else_watch(Op(5), "key"),
            lambda: purgatory.try_complete_else_watch(Op(5), b"key"),
            lambda: purgatory.try_complete_else_watch(Op(5), [["unhashable"]]),
            lambda: purgatory.check_and_complete(["unhashable"]),
            lambda: purgatory.cancel_for_key({}),
            lambda: Op(1.5),
            lambda: Op(5, "not a lock"),
        ):
            with pytest.raises((TypeError, ValueError)) as info:
                call()
            seen.append(f"{info.type.__name__}: {info.value}")
        purgatory.shutdown()
        with pytest.raises(RuntimeError) as info:
            purgatory.try_complete_else_watch(Op(5), ["k"])
        seen.append(str(info.value))
        return seen

    assert errors(tickwheel) == errors(PURE)


def test_the_timer_is_set_once_on_both_paths() -> None:
    for pkg in (tickwheel, PURE):
        timer = pkg.SystemTimer(clock=pkg.ManualClock(0), executor="inline")
        purgatory = pkg.DelayedOperationPurgatory("t", timer=timer, reaper_enabled=False)
        assert purgatory.timer is timer
        with pytest.raises(AttributeError):
            purgatory.timer = timer
        purgatory.shutdown()


def test_an_ops_own_lock_is_an_rlock_the_collector_need_not_track() -> None:
    import gc

    class Op(tickwheel.DelayedOperation):
        __slots__ = ()

        def try_complete(self) -> bool:
            return False

        def on_complete(self) -> None:
            pass

    op = Op(10)
    assert isinstance(op.lock, type(threading.RLock()))
    assert not gc.is_tracked(op.lock)  # it refers to nothing that can form a cycle
    assert gc.is_tracked(op)
    with op.lock, op.lock:  # re-entrant
        assert op.lock._is_owned()  # type: ignore[attr-defined]
    shared = threading.RLock()
    assert Op(10, shared).lock is shared and gc.is_tracked(shared)  # a passed lock is left alone
    del op
    gc.collect()
