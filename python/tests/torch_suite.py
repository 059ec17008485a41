#!/usr/bin/env python3
"""Run PyTorch's own distributed test suite against a third-party backend.

The suite is ``DistributedTest._DistTestBase`` in
``torch/testing/_internal/distributed/distributed_test.py``, which every torch
wheel ships. The backend comes from a plugin module that registers it with
``torch.distributed.Backend.register_backend`` when imported.

    python python/tests/torch_suite.py --backend braid --module braid_torch --world-size 2
    python python/tests/torch_suite.py --backend braid --module braid_torch -k all_reduce
    python python/tests/torch_suite.py --backend braid --list
    python python/tests/torch_suite.py --backend braid --write-skips

Which tests run: every test of _DistTestBase except those gated to GPUs, to
one of torch's built-in backends (gloo, nccl, mpi) or disabled upstream. The
choice is made from each test's decorators (see ``classify``), and the tests
left out, with the reason, are in torch_suite_skips.txt beside this file
(written by ``--write-skips``; a run warns when the file and the installed
torch disagree). Tests that need a world size other than the one asked for,
or an optional package (torchvision), stay selected and are reported skipped.

How a run works: the environment that distributed_test reads at import
(BACKEND, WORLD_SIZE, TEMP_DIR, INIT_METHOD) is set first; the backend joins
DistTestCases.backend_feature's "plugin", "ddp", "subgroup", "gpu" and "cuda"
sets so that no test is skipped merely for being a plugin; the plugin module
is imported; then distributed_test. Collectives a backend lacks (its
DistTestCases.skip_collective keys) are in SKIP_COLLECTIVE below, and
environment variables that some tests need (braid's BRAID_ANY_SOURCE) in
TEST_ENV. Each test starts WORLD_SIZE ranks. By default they are spawned, as
in torch's own CI: each imports torch, the plugin and this file again (as
``__mp_main__``, taking its settings from the environment, so the module level
below must stay importable without arguments), about 5 s of CPU per rank,
which is most of a run's time. ``--start-method fork`` copies the driver
instead and runs the same tests over ten times faster. ``--timeout`` bounds one
test (torch's default is 300 s; the ranks' process groups time out at 60 s).

Needs expecttest beside torch (pip install expecttest): torch.testing._internal
imports it.

The last line printed is ``torch_suite: N passed, N failed, N skipped``; the
exit status is 1 when any test failed or errored, 2 on a usage error.
"""

import argparse
import ast
import atexit
import fnmatch
import importlib
import inspect
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SKIPS_FILE = os.path.join(HERE, "torch_suite_skips.txt")

# DistTestCases.backend_feature sets the plugin backend joins. "plugin" makes
# require_backend_is_available() accept a backend that is not built in; "ddp"
# and "subgroup" gate CPU tests of DDP and new_subgroups; "gpu" is (despite its
# name) the only gate of the CPU object-collective tests (all_gather_object,
# gather_object). "cuda" gates only tests that also need GPUs (not selected);
# joining it keeps their recorded reason "needs CUDA" rather than "plugin".
FEATURES = ("plugin", "ddp", "subgroup", "gpu", "cuda")

# DistTestCases.skip_collective keys a backend does not offer, with the reason
# written to torch_suite_skips.txt. Only a feature the backend really lacks
# belongs here, never a test that fails. Keys: "allgather_coalesced",
# "reduce", "sendrecv anysource", "cpu barrier".
SKIP_COLLECTIVE = {
    "braid": {},
    "fakegloo": {},
}

# Environment a backend needs for some tests, set in the driver before the
# ranks start and restored after: (glob over test names, {variable: value}).
# braid receives from any source only where every rank has BRAID_ANY_SOURCE=1
# (each send then announces itself through the store), so only the tests of
# recv-from-any-source run in that mode and the rest in braid's default one.
TEST_ENV = {
    "braid": [("test_send_recv_any_source*", {"BRAID_ANY_SOURCE": "1"})],
}

# Decorators of _DistTestBase tests, by what they do to a CPU plugin run.
# Evaluated when the test module is imported (they set __unittest_skip__):
# probed by applying them to a dummy function.
CLASS_TIME = {
    "skip_but_pass_in_sandcastle_if",
    "skip_but_pass_in_sandcastle",
    "unittest.skipIf",
    "unittest.skip",
    "require_backend_is_available",
    "requires_nccl_version",
    "skip_if_rocm_multiprocess",
}
# Skips that depend on the world size or an optional package: the test stays
# selected and is reported skipped where the condition holds.
CONDITIONAL = {
    "require_world_size": "needs world size >= {0}",
    "require_exact_world_size": "needs world size == {0}",
    "skip_if_small_worldsize": "needs world size >= 8",
    "skip_if_odd_worldsize": "needs an even world size",
    "skipIfNoTorchVision": "needs torchvision",
}
# Of those, the ones checked in the ranks (sys.exit with a skip code), and
# when they skip for a plugin backend at world size w.
RANK_TIME_WORLD_SIZE = {
    "skip_if_small_worldsize": lambda w: w < 8,
    "skip_if_odd_worldsize": lambda w: w % 2 == 1,
}
# Decorators that change nothing for a non-nccl backend on the CPU.
NO_EFFECT = {
    "with_dist_debug_levels",
    "with_nccl_blocking_wait",
    "nccl_skip_if_lt_x_gpu",  # nccl only
    "require_n_gpus_for_nccl_backend",  # nccl only
}
# Tests that fail against every plugin backend, for a reason in torch itself
# (shown with fake_gloo_plugin, which is gloo under another name). Not run;
# --all runs them.
PLUGIN_LIMITS = {
    "test_ddp_logging_data_cpu": "fails for any plugin: DDP logs backend_name 'custom' "
    "(ProcessGroup.name() of a registered backend), the test expects dist.get_backend()",
}
BUILT_IN = ("gloo", "mpi", "nccl", "ucc", "xccl", "hccl")

ENV_MODULE = "TORCH_SUITE_MODULE"
ENV_SKIP_COLLECTIVE = "TORCH_SUITE_SKIP_COLLECTIVE"


def _parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backend", required=True, help="backend name the plugin registers")
    p.add_argument(
        "--module",
        help="plugin module to import (registers the backend); not needed for --list/--write-skips",
    )
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument(
        "-k",
        dest="patterns",
        action="append",
        default=[],
        help="run only selected tests matching this substring or glob (repeatable)",
    )
    p.add_argument("--list", action="store_true", help="print the selected tests and exit")
    p.add_argument(
        "--write-skips",
        nargs="?",
        const=SKIPS_FILE,
        metavar="PATH",
        help=f"write the tests not run, with reasons, and exit (default {SKIPS_FILE})",
    )
    p.add_argument(
        "--timeout",
        type=int,
        help="seconds one test may take before its processes are killed (torch's default: 300)",
    )
    p.add_argument(
        "--skip-collective",
        metavar="KEYS",
        help="comma-separated DistTestCases.skip_collective keys the backend lacks, instead of "
        "this driver's table (SKIP_COLLECTIVE); '' for none, to check whether one now works",
    )
    p.add_argument(
        "--start-method",
        choices=("spawn", "fork"),
        default=os.environ.get("TORCH_SUITE_START_METHOD", "spawn"),
        help="how each test starts its ranks: spawn (as torch's CI does; each rank imports torch "
        "and the suite again, about 5 s of CPU) or fork (ranks copy the driver; much faster)",
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="ignore the selection and run every test (-k still applies); for investigation",
    )
    args = p.parse_args(argv)
    args.backend = args.backend.lower()
    if args.backend in BUILT_IN:
        p.error(f"{args.backend} is built into torch; this driver is for plugin backends")
    if args.world_size < 1:
        p.error("--world-size must be at least 1")
    if not (args.list or args.write_skips) and not args.module:
        p.error("--module is required to run tests")
    return args


def _configure_environment(args):
    """What distributed_test reads at import; inherited by the spawned ranks."""
    os.environ["BACKEND"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ.setdefault("INIT_METHOD", "env://")
    temp_dir = tempfile.mkdtemp(prefix="torch_suite_")
    driver = os.getpid()
    atexit.register(lambda: os.getpid() == driver and shutil.rmtree(temp_dir, ignore_errors=True))
    for sub in ("barrier", "test_dir", "init_dir"):
        os.mkdir(os.path.join(temp_dir, sub))
    os.environ["TEMP_DIR"] = temp_dir
    # The selection holds CPU tests only, and TestDistBackend skips every test
    # when fewer GPUs than ranks are visible: hide GPUs so that a run does the
    # same on a machine with one.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    if args.module and not (args.list or args.write_skips):
        os.environ[ENV_MODULE] = args.module
    else:
        os.environ.pop(ENV_MODULE, None)
    if args.timeout:
        os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.timeout)
    if args.skip_collective is not None:
        keys = [k.strip() for k in args.skip_collective.split(",") if k.strip()]
        SKIP_COLLECTIVE[args.backend] = {k: "given by --skip-collective" for k in keys}
    os.environ[ENV_SKIP_COLLECTIVE] = ",".join(sorted(SKIP_COLLECTIVE.get(args.backend, {})))
    return temp_dir


if __name__ == "__main__":
    ARGS = _parse_args(sys.argv[1:])
    TEMP_DIR = _configure_environment(ARGS)
    # torch.testing._internal.common_utils parses sys.argv when imported (and
    # the spawned ranks get this process's argv): leave it only the program.
    sys.argv = sys.argv[:1]

# From here on, the code runs in the driver and in every spawned rank.
if "BACKEND" not in os.environ:
    raise SystemExit("torch_suite.py: run it as a script (BACKEND is not set)")
BACKEND = os.environ["BACKEND"]

if os.environ.get(ENV_MODULE):
    importlib.import_module(os.environ[ENV_MODULE])

try:
    import expecttest  # noqa: E402, F401
except ImportError:
    raise SystemExit("torch_suite.py: torch.testing._internal needs expecttest: pip install expecttest")
from torch.testing._internal import common_distributed  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for _feature in FEATURES:
    DistTestCases.backend_feature.setdefault(_feature, set()).add(BACKEND)
for _key in filter(None, os.environ.get(ENV_SKIP_COLLECTIVE, "").split(",")):
    if _key not in DistTestCases.skip_collective:
        raise SystemExit(
            f"torch_suite.py: no skip_collective key {_key!r}; torch has {sorted(DistTestCases.skip_collective)}"
        )
    DistTestCases.skip_collective[_key].add(BACKEND)

import torch  # noqa: E402
import torch.multiprocessing  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


def _restore_env(var, value):
    if value is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = value


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    start_method = "spawn"
    # Tests whose ranks would only exit with a skip code at this world size:
    # skipped here, with torch's words, without starting ranks.
    pre_skip = {}

    def setUp(self):
        reason = self.pre_skip.get(self._testMethodName)
        if reason:
            raise unittest.SkipTest(reason)
        for pattern, env in TEST_ENV.get(BACKEND, []):
            if fnmatch.fnmatchcase(self._testMethodName, pattern):
                for var, value in env.items():
                    self.addCleanup(_restore_env, var, os.environ.get(var))
                    os.environ[var] = value
        super().setUp()
        if self.start_method == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()

    @classmethod
    def _run(cls, *args, **kwargs):
        # A forked rank inherits the driver's SIGTERM handler, which would
        # keep terminate() from ending a rank blocked in C++.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        super()._run(*args, **kwargs)

    def tearDown(self):
        super().tearDown()
        # MultiProcessTestCase.setUp made this file (the ranks' init file).
        try:
            os.remove(self.file_name)
        except OSError:
            pass


# --------------------------------------------------------------------------
# Selection


def _decorator_name(node):
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target)


def _backend_names(node):
    """The built-in backends a skip condition compares BACKEND with."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Compare):
            operands = [sub.left] + list(sub.comparators)
            if any(ast.unparse(o) in ("BACKEND", "os.environ['BACKEND']") for o in operands):
                for o in operands:
                    if isinstance(o, ast.Constant) and isinstance(o.value, str):
                        names.add(o.value)
        if isinstance(sub, ast.Set):
            for elt in sub.elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    names.add(elt.value)
    return names


def _short(text, limit=90):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _class_time_reason(node, why):
    """Words for a decorator that skips at import: what kind of gate it is."""
    name = _decorator_name(node)
    src = ast.unparse(node)
    if name in ("unittest.skip", "skip_but_pass_in_sandcastle") or (
        name == "skip_but_pass_in_sandcastle_if" and ast.unparse(node.args[0]) == "True"
    ):
        return f"disabled upstream: {_short(why)}"
    if "skip_collective" in src:
        key = ast.literal_eval(
            next(
                s.slice
                for s in ast.walk(node)
                if isinstance(s, ast.Subscript) and "skip_collective" in ast.unparse(s.value)
            )
        )
        own = SKIP_COLLECTIVE.get(BACKEND, {}).get(key, "")
        return f"{BACKEND} does not offer {key}" + (f": {own}" if own else "")
    if name == "requires_nccl_version":
        return "gated to nccl"
    if name == "skip_if_rocm_multiprocess":
        return "skipped on ROCm"
    gated = sorted(_backend_names(node) & set(BUILT_IN))
    if gated:
        if name == "require_backend_is_available":
            return f"gated to {'/'.join(gated)}"
        return f"gated to {'/'.join(gated)}: {_short(why)}"
    return _short(why)


def classify(test_base, namespace):
    """Map each test of test_base to (selected, reasons, conditions).

    reasons: why a test is not run (empty when selected); conditions: what
    skips a selected test at run time (world size, optional packages).
    Raises on a decorator this driver does not know, so that a torch upgrade
    that adds one is looked at rather than guessed about.
    """
    source_file = inspect.getsourcefile(distributed_test)
    with open(source_file) as f:
        tree = ast.parse(f.read())
    cls = next(
        n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == test_base.__name__
    )
    defined = {
        n.name: n
        for n in cls.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
    }
    names = sorted(n for n in dir(test_base) if n.startswith("test"))
    unknown = []
    verdicts = {}
    for name in names:
        node = defined.get(name)
        if node is None:
            # Made by instantiate_parametrized_tests: find the template.
            templates = [k for k in defined if name.startswith(k + "_")]
            node = defined[max(templates, key=len)] if templates else None
            if node is None:
                unknown.append(f"{name}: no definition found in {source_file}")
                continue
        reasons, conditions, class_time_skip = [], [], False
        for deco in node.decorator_list:
            dname = _decorator_name(deco)
            if dname in NO_EFFECT:
                continue
            if dname == "skip_if_no_gpu":
                reasons.append("needs CUDA")
            elif dname == "skip_if_lt_x_gpu":
                arg = ast.unparse(deco.args[0])
                reasons.append(
                    "needs CUDA: a GPU per rank" if "WORLD_SIZE" in arg else f"needs CUDA: {arg} GPUs"
                )
            elif dname in RANK_TIME_WORLD_SIZE:
                conditions.append(CONDITIONAL[dname])
                if RANK_TIME_WORLD_SIZE[dname](int(os.environ["WORLD_SIZE"])):
                    TestDistBackendWithSpawn.pre_skip[name] = common_distributed.TEST_SKIPS[
                        "small_worldsize" if dname == "skip_if_small_worldsize" else "odd_worldsize"
                    ].message
            elif dname in CONDITIONAL:
                args = [ast.unparse(a) for a in getattr(deco, "args", [])]
                conditions.append(CONDITIONAL[dname].format(*args))
                if dname in ("require_world_size", "require_exact_world_size", "skipIfNoTorchVision"):
                    probe = eval(compile(ast.Expression(deco), source_file, "eval"), namespace)
                    class_time_skip |= bool(getattr(probe(_probe_function()), "__unittest_skip__", False))
            elif dname in CLASS_TIME:
                decorator = eval(compile(ast.Expression(deco), source_file, "eval"), namespace)
                result = decorator(_probe_function())
                if getattr(result, "__unittest_skip__", False):
                    class_time_skip = True
                    reasons.append(_class_time_reason(deco, result.__unittest_skip_why__))
            else:
                unknown.append(f"{name}: decorator {ast.unparse(deco)}")
        # Cross-check with what the imported class really carries.
        actual = bool(getattr(getattr(test_base, name), "__unittest_skip__", False))
        if actual != class_time_skip:
            unknown.append(
                f"{name}: imported test has __unittest_skip__={actual}, the decorators say {class_time_skip}"
            )
        if name in PLUGIN_LIMITS:
            reasons.append(PLUGIN_LIMITS[name])
        verdicts[name] = (not reasons, list(dict.fromkeys(reasons)), conditions)
    if unknown:
        raise SystemExit(
            "torch_suite.py: cannot classify these tests (update the driver):\n  " + "\n  ".join(unknown)
        )
    return verdicts


def _probe_function():
    def probe(*args, **kwargs):
        pass

    return probe


def _skips_text(verdicts):
    excluded = {n: v for n, v in verdicts.items() if not v[0]}
    conditional = {n: v for n, v in verdicts.items() if v[0] and v[2]}
    width = max(len(n) for n in verdicts) + 2
    lines = [
        "# Tests of torch.testing._internal.distributed.distributed_test.DistributedTest._DistTestBase",
        "# that python/tests/torch_suite.py does not run against a plugin backend, and why.",
        f"# torch {torch.__version__}, backend {BACKEND}: {len(verdicts)} tests, "
        f"{len(verdicts) - len(excluded)} selected, {len(excluded)} not run.",
        f"# Written by: python python/tests/torch_suite.py --backend {BACKEND} --write-skips",
        "",
    ]
    lines += [f"{n:<{width}}{'; '.join(v[1])}" for n, v in sorted(excluded.items())]
    lines += [
        "",
        "# Selected, but reported skipped where the condition holds:",
    ]
    lines += [f"# {n:<{width}}{'; '.join(v[2])}" for n, v in sorted(conditional.items())]
    return "\n".join(lines) + "\n"


def _excluded_in_file(path):
    """(backend, tests not run) as recorded in path; (None, None) if unreadable."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None, None
    found = re.search(r"^# torch \S+, backend (\S+):", text, re.M)
    tests = {ln.split()[0] for ln in text.splitlines() if ln.strip() and not ln.startswith("#")}
    return (found.group(1) if found else None), tests


def _matches(name, patterns):
    if not patterns:
        return True
    for pat in patterns:
        if any(c in pat for c in "*?["):
            if fnmatch.fnmatchcase(name, pat if pat.startswith("*") else "*" + pat + "*"):
                return True
        elif pat in name:
            return True
    return False


# --------------------------------------------------------------------------
# Running


class _Result(unittest.TestResult):
    def __init__(self, total):
        super().__init__()
        self.total = total
        self.records = []  # (name, outcome, seconds, detail)
        self._start = None

    @staticmethod
    def _name(test):
        return test.id().split(".")[-1]

    def startTest(self, test):
        super().startTest(test)
        self.current = test
        self._start = time.monotonic()
        print(f"=== [{self.testsRun}/{self.total}] {self._name(test)}", flush=True)

    def _record(self, test, outcome, detail=""):
        seconds = time.monotonic() - self._start if self._start else 0.0
        self.records.append((self._name(test), outcome, seconds, detail))
        shown = f" ({_short(detail, 120)})" if outcome == "skipped" else ""
        print(f"--- {self._name(test)}: {outcome} in {seconds:.1f} s{shown}", flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self.failures[-1][1])
        print(self.failures[-1][1], flush=True)

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self.errors[-1][1])
        print(self.errors[-1][1], flush=True)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Timeout|Failure)\b:?")


def _first_error_line(detail):
    """The exception line of the last traceback in detail ('' if none)."""
    lines = detail.split("To execute this test, run")[0].splitlines()
    last_tb = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback")), default=-1)
    for ln in lines[last_tb + 1 :]:
        if _EXCEPTION_LINE.match(ln) and not ln.startswith("RuntimeError: Process "):
            return ln.strip()
    rest = [ln.strip() for ln in lines if ln.strip()]
    return rest[-1] if rest else ""


def _rank_errors(detail):
    """One error line per rank from 'Process i exited ... exception:' blocks."""
    marker = re.compile(r"Process (\d+) exited with error code \d+ and exception:")
    parts = marker.split(detail)
    # parts: [before, rank, block, rank, block, ...]
    return [f"rank {r}: {_first_error_line(b)}" for r, b in zip(parts[1::2], parts[2::2])]


def main():
    verdicts = classify(DistributedTest._DistTestBase, vars(distributed_test))
    selected = [n for n, v in verdicts.items() if v[0]]

    if ARGS.write_skips:
        with open(ARGS.write_skips, "w") as f:
            f.write(_skips_text(verdicts))
        print(f"wrote {ARGS.write_skips}: {len(verdicts) - len(selected)} of {len(verdicts)} tests not run")
        return 0

    recorded_backend, recorded = _excluded_in_file(SKIPS_FILE)
    computed = {n for n, v in verdicts.items() if not v[0]}
    if recorded_backend == BACKEND and ARGS.skip_collective is None and recorded != computed:
        print(
            f"torch_suite: warning: {SKIPS_FILE} is out of date for this torch/backend "
            f"(only in file: {sorted(recorded - computed)}; only computed: {sorted(computed - recorded)}); "
            "rerun with --write-skips",
            file=sys.stderr,
        )

    pool = sorted(verdicts) if ARGS.all else selected
    chosen = [n for n in pool if _matches(n, ARGS.patterns)]
    if ARGS.patterns:
        left_out = [n for n in verdicts if n not in pool and _matches(n, ARGS.patterns)]
        if len(left_out) <= 5:
            for n in left_out:
                print(f"torch_suite: {n} not selected: {'; '.join(verdicts[n][1])}", file=sys.stderr)
        else:
            print(
                f"torch_suite: {len(left_out)} more tests match but are not selected "
                f"(reasons in {os.path.basename(SKIPS_FILE)}; --all runs them)",
                file=sys.stderr,
            )
    if ARGS.list:
        for n in chosen:
            print(n)
        print(f"{len(chosen)} of {len(verdicts)} tests", file=sys.stderr)
        return 0
    if not chosen:
        print("torch_suite: no test matches", file=sys.stderr)
        return 2

    if ARGS.timeout:
        common_distributed.TIMEOUT_DEFAULT = ARGS.timeout
        common_distributed.TIMEOUT_OVERRIDE.clear()

    print(
        f"torch_suite: {len(chosen)} tests, backend {BACKEND} from {os.environ[ENV_MODULE]}, "
        f"world size {os.environ['WORLD_SIZE']}",
        flush=True,
    )
    TestDistBackendWithSpawn.start_method = ARGS.start_method
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in chosen)
    result = _Result(len(chosen))
    began = time.monotonic()
    interrupted = None

    def _on_signal(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        suite.run(result)
    except KeyboardInterrupt as e:
        # Killed (a CI step's timeout, ^C): end the ranks, which would
        # otherwise outlive the driver, and report what ran.
        interrupted = str(e) or "SIGINT"
        for child in torch.multiprocessing.active_children():
            child.terminate()
        if result._start is not None and len(result.records) < result.testsRun:
            result._record(result.current, "failed", f"interrupted by {interrupted}")
    wall = time.monotonic() - began

    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for _, outcome, _, _ in result.records:
        counts[outcome] += 1

    print()
    slowest = sorted(result.records, key=lambda r: -r[2])[:10]
    print("slowest: " + ", ".join(f"{n} {s:.1f} s" for n, _, s, _ in slowest))
    skipped = [r for r in result.records if r[1] == "skipped"]
    if skipped:
        print("skipped:")
        for n, _, _, why in skipped:
            print(f"  {n}: {_short(why, 120)}")
    failed = [r for r in result.records if r[1] == "failed"]
    if failed:
        print("failed:")
        for n, _, s, detail in failed:
            ranks = _rank_errors(detail)
            print(f"  {n} ({s:.1f} s): {'; '.join(ranks) if ranks else _first_error_line(detail)}")
    if interrupted:
        print(f"interrupted by {interrupted} after {len(result.records)} of {len(chosen)} tests")
    print(
        f"wall time {wall:.0f} s, world size {os.environ['WORLD_SIZE']}, "
        f"ranks started by {ARGS.start_method}"
    )
    print(
        f"torch_suite: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped",
        flush=True,
    )
    return 1 if counts["failed"] or interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
