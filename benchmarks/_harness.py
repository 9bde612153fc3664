"""Machinery shared by the benchmark scripts in this directory.

A benchmark script re-invokes itself with `--worker JSON` for every (point, method), so
each measurement runs in a fresh process (run_worker, best_of_rounds). Inside the worker,
measure_call warms nothing up itself: the caller runs a tiny call of the same method first,
then measure_call resets the peak RSS to the current RSS, takes the first real call's peak
RSS increase as the method's memory (its output plus any workspace) and times the next
calls. The main process keeps, per (point, method), the round with the smallest median.
"""
import argparse
import contextlib
import datetime
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
SLOW_CALL_S = 2.0
SLOW_CALL_MAX_REPS = 3
MAX_REPS = 500  # measure_call's min_time_s stops here

PEAK_CODE = """
import time
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal((4096, 4096), dtype=np.float32)
b = rng.standard_normal((4096, 4096), dtype=np.float32)
a @ b
times = []
for _ in range(3):
    t = time.perf_counter()
    a @ b
    times.append(time.perf_counter() - t)
print(*(2 * 4096 ** 3 / t / 1e9 for t in times))
"""


def max_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_max_rss():
    """Lowers this process's peak RSS to its current RSS (Linux 4.0+; a no-op elsewhere).

    Building the inputs frees temporaries (the numpy arrays copied into tf constants), so
    without this the peak would sit above the current RSS and hide part of the increase.
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def measure_call(call, reps, keep=None, budget_s=None, min_time_s=0.0):
    """Peak RSS increase and time of call()'s first run, then the times of `reps` more.

    Run a tiny call of the same method before this, so that the first call's peak RSS
    holds only the method's own memory. A first call slower than SLOW_CALL_S caps reps at
    SLOW_CALL_MAX_REPS. keep(first_output), if given, is evaluated after the memory is
    read and before the first output is dropped; its value comes back as "kept".
    budget_s, if given, bounds the time of all the calls, the first included: a timed call
    starts only if the time spent plus the previous call's time fits in it. If not even
    one fits, "median_s" is the first call's time and "reps" is 0.
    min_time_s: calls past `reps` (up to MAX_REPS) until the timed calls took this
    long, so that a millisecond call's median does not rest on a few calls made
    just after its first (3 such calls of a 1.5 ms step read 2.3 ms).
    """
    reset_max_rss()
    baseline = max_rss_bytes()
    start = time.perf_counter()
    first = call()
    warmup_s = time.perf_counter() - start
    rss_increase = max_rss_bytes() - baseline
    kept = keep(first) if keep else None
    del first
    if warmup_s > SLOW_CALL_S:
        reps = min(reps, SLOW_CALL_MAX_REPS)
    times = []
    spent = warmup_s
    while len(times) < reps or (sum(times) < min_time_s and len(times) < MAX_REPS):
        if budget_s is not None and spent + (times[-1] if times else warmup_s) > budget_s:
            break
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
        spent += times[-1]
    return {
        "median_s": statistics.median(times) if times else warmup_s,
        "times_s": times,
        "warmup_s": warmup_s,
        "reps": len(times),
        "baseline_maxrss_bytes": baseline,
        "rss_increase_bytes": rss_increase,
        "kept": kept,
    }


def run_worker(script, spec, timeout=None, max_rss=None):
    """Runs `script --worker JSON(spec)` in a fresh subprocess; returns the JSON its last
    stdout line holds, or {"error": ...}.

    The subprocess runs in this directory: from the repository root, the source folder
    tfbigconv/ (no compiled modules) would shadow the installed package.

    With timeout (seconds) or max_rss (bytes), the subprocess is watched (its RSS read
    every WATCH_POLL_S) and killed when it runs longer or its RSS goes over; the error
    then says so, and every error result carries "observed_peak_rss_bytes" (the largest
    RSS seen, which can miss a short peak) and "elapsed_s".
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, os.path.abspath(script), "--worker", json.dumps(spec)]
    if timeout is None and max_rss is None:
        proc = subprocess.run(cmd, env=env, cwd=HERE, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            return {"error": tail[0]}
        return json.loads(proc.stdout.strip().splitlines()[-1])
    returncode, stdout, stderr, killed, peak, elapsed = _run_watched(
        cmd, env, timeout, max_rss)
    if killed or returncode != 0:
        if killed:
            error = killed
        elif returncode < 0:
            error = f"killed by signal {-returncode}" + (" (OOM?)" if -returncode == 9 else "")
        else:
            error = (stderr.strip().splitlines()[-1:] or [f"exit status {returncode}"])[0]
        return {"error": error, "observed_peak_rss_bytes": peak, "elapsed_s": elapsed}
    return json.loads(stdout.strip().splitlines()[-1])


WATCH_POLL_S = 0.1


def process_rss_bytes(pid):
    """Current RSS of process pid (Linux /proc), or 0 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run_watched(cmd, env, timeout, max_rss):
    """(returncode, stdout, stderr, why killed or None, largest RSS seen, elapsed s)."""
    proc = subprocess.Popen(cmd, env=env, cwd=HERE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    peak, killed = 0, None
    while True:
        try:
            stdout, stderr = proc.communicate(timeout=WATCH_POLL_S)
            break
        except subprocess.TimeoutExpired:
            pass
        rss = process_rss_bytes(proc.pid)
        peak = max(peak, rss)
        elapsed = time.monotonic() - start
        if timeout is not None and elapsed > timeout:
            killed = f"timeout (killed after {timeout:g} s)"
        elif max_rss is not None and rss > max_rss:
            killed = (f"killed: RSS {rss / MIB:.0f} MiB went over the cap of "
                      f"{max_rss / MIB:.0f} MiB")
        if killed:
            proc.kill()
            stdout, stderr = proc.communicate()
            break
    return proc.returncode, stdout, stderr, killed, peak, time.monotonic() - start


def better(best, res):
    """The result to keep of two rounds: one without an error, then the smaller median."""
    if best is None or "error" in best:
        return res
    if "error" not in res and res["median_s"] < best["median_s"]:
        return res
    return best


def best_of_rounds(script, specs, rounds, label):
    """Runs each spec of {method: spec} `rounds` times, interleaving the methods round by
    round (the machine is noisy); returns {method: the best round's result}."""
    best = {}
    for rnd in range(rounds):
        for method, spec in specs.items():
            res = run_worker(script, spec)
            best[method] = better(best.get(method), res)
            status = res["error"] if "error" in res else f"{1e3 * res['median_s']:.1f} ms"
            print(f"  {label} {method} round {rnd + 1}: {status}", file=sys.stderr)
    return best


CONTENDER_HEADER = ["| case | pass | method | time | peak RSS increase | vs ours (time, RSS) |",
                    "|---|---|---|---|---|---|"]


def contender_rows(case, pass_, best, ours="ours"):
    """CONTENDER_HEADER's rows for one case and pass: each contender's median time and
    first call's peak RSS increase (best_of_rounds' results), and its ratios to `ours`."""
    base = best.get(ours, {})
    rows = []
    for m, r in best.items():
        if "error" in r:
            rows.append(f"| {case} | {pass_} | {m} | {r['error'][:160]} | | |")
            continue
        ratio = "" if m == ours or "median_s" not in base else (
            f"{r['median_s'] / base['median_s']:.2f}x the time, "
            f"{r['rss_increase_bytes'] / max(1, base['rss_increase_bytes']):.2f}x RSS")
        rows.append(f"| {case} | {pass_} | {m} | {r['median_s'] * 1e3:.1f} ms | "
                    f"{r['rss_increase_bytes'] / MIB:.0f} MiB | {ratio} |")
    return rows


def measure_peak_gflops():
    """GFLOP/s of 3 numpy float32 matmuls, each measured (the peak is the best).

    OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from the environment: they slow
    OpenBLAS down here.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    proc = subprocess.run([sys.executable, "-c", PEAK_CODE], env=env, cwd=HERE,
                          capture_output=True, text=True, check=True)
    return [float(v) for v in proc.stdout.split()]


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def run_header(tf_version, extra=""):
    """(command, date, header): the markdown line that says how and where a table was made."""
    command = shlex.join([os.path.basename(sys.executable)] + sys.argv)
    date = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    header = (f"`{command}` — {date}, TensorFlow {tf_version}, CPU {cpu_model()} "
              f"({os.cpu_count()} cores){extra}")
    return command, date, header


def append_markdown(path, title, header, body):
    """Appends a `### title` section with the header line and the body to path."""
    with open(path, "a") as f:
        f.write(f"\n### {title}\n\n{header}\n\n{body}\n")


def write_json(path, data):
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def publish(args, title, header, body, data):
    """Prints the header line and the body; appends them as section `title` to args.out
    (append_markdown) and writes data to args.json (write_json), where given."""
    print(header)
    print()
    print(body)
    if args.out:
        append_markdown(args.out, title, header, body)
    if args.json:
        write_json(args.json, data)


def parse_args_or_work(parser, worker):
    """parser's arguments, with the hidden --worker option added last. With --worker JSON
    (how run_worker starts a script), runs worker(spec) in this process and exits."""
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        sys.exit()
    return args


def rel_l2(a, ref):
    """||a - ref|| / ||ref||."""
    import numpy as np
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


ENV_AUTOTUNE = "TFBIGCONV_AUTOTUNE"
ENV_CACHE = "TFBIGCONV_AUTOTUNE_CACHE"


@contextlib.contextmanager
def fresh_autotune_env(under=None):
    """Autotuning on, no forced algorithm, and an autotune cache file of this process's
    own (removed after; `under`, a folder the caller removes, keeps it from lingering
    when the process is killed), so that the process starts cold."""
    os.environ.pop(ENV_AUTOTUNE, None)
    os.environ.pop("TFBIGCONV_ALGORITHM", None)  # it would override every algorithm
    cache_dir = tempfile.mkdtemp(prefix="tfbigconv_bench_autotune_", dir=under)
    os.environ[ENV_CACHE] = os.path.join(cache_dir, "autotune.json")
    try:
        yield
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


@contextlib.contextmanager
def autotune_off():
    """TFBIGCONV_AUTOTUNE=0 inside (the package reads it when it plans: at trace time)."""
    old = os.environ.get(ENV_AUTOTUNE)
    os.environ[ENV_AUTOTUNE] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_AUTOTUNE, None)
        else:
            os.environ[ENV_AUTOTUNE] = old


def build_step(conv, x, w, g_out):
    """A call of y = conv(x, w) and both gradients of sum(y * g_out), under tf.function;
    returns the numpy gradients [dx, dw].

    The step returns the loss too, so that the forward pass runs: the gradients of
    this linear loss do not need y, and a function that returned them alone ran
    the two gradient passes only (TF prunes what no output needs). Until
    2026-11-27 every "fwd+bwd" number measured that way."""
    import tensorflow as tf

    @tf.function
    def step(x, w):
        with tf.GradientTape() as t:
            t.watch([x, w])
            loss = tf.reduce_sum(conv(x, w) * g_out)
        return loss, t.gradient(loss, [x, w])

    def call():
        loss, grads = step(x, w)
        loss.numpy()
        return [v.numpy() for v in grads]
    call.op_types = lambda: op_types(step, x, w)
    call.step = step
    return call


# Ops that move or name tensors but compute nothing: left out when graphs are compared.
BOOKKEEPING_OPS = {"Const", "Identity", "IdentityN", "NoOp", "Placeholder"}


def _kernel(op):
    """An op's type, and for our ops the algorithm it runs ("BigConv2D[fft]"): the
    trace-time plan where algorithm is "auto", else the algorithm requested."""
    try:
        algorithm = op.get_attr("algorithm").decode()
    except ValueError:
        return op.type  # not one of our ops
    try:
        planned = op.get_attr("planned_algorithm").decode()
    except ValueError:
        planned = ""
    return f"{op.type}[{planned if algorithm == 'auto' and planned else algorithm}]"


def op_types(function, *args):
    """{op type (with our ops' algorithm): count} of a tf.function's graph for these
    arguments, bookkeeping ops left out: two calls with equal counts run the same kernels."""
    import collections
    graph = function.get_concrete_function(*args).graph
    return dict(collections.Counter(_kernel(op) for op in graph.get_operations()
                                    if op.type not in BOOKKEEPING_OPS))


def warm_up(dtype="float32"):
    """Pays a process's one-time costs (the first gradient trace, the first bigconv2d
    gradient, the planner's and the autotuner's first use: about a second in all) on a
    tiny convolution, so that they land in no measured first call. Errors are ignored:
    the measured calls will show them."""
    import tensorflow as tf
    import tfbigconv
    x, w, g = tf.ones((1, 8, 8, 2), dtype), tf.ones((3, 3, 2, 2), dtype), tf.ones((1, 8, 8, 2), dtype)
    convs = [(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), contextlib.nullcontext())]
    for algorithm, env in (("direct", contextlib.nullcontext()), ("auto", autotune_off()),
                           ("auto", contextlib.nullcontext())):
        convs.append((lambda x, w, a=algorithm: tfbigconv.bigconv2d(x, w, 1, "SAME", algorithm=a),
                      env))
    for conv, env in convs:
        try:
            with env:
                build_step(conv, x, w, g)()
        except Exception:
            pass


SELF_CHECK_TOL = 1e-5


def self_check_cases(cases, errors):
    """The self-check's results: for each (input shape, filter shape, padding) of cases,
    random float32 x and w (one default_rng(0) for all, drawn in turn) and
    errors(x, w, padding), a {name: relative L2} dict."""
    import numpy as np
    rng = np.random.default_rng(0)
    results = []
    for in_shape, f_shape, padding in cases:
        x = rng.standard_normal(in_shape, dtype=np.float32)
        w = rng.standard_normal(f_shape, dtype=np.float32)
        results.append({"input_shape": in_shape, "filter_shape": f_shape, "padding": padding,
                        "rel_l2": errors(x, w, padding)})
    return results


def run_self_check(script, what, then_exit=False):
    """Runs `script`'s worker in self_check mode: its hand-written contenders
    (and references) against TensorFlow's own, worst relative L2 under
    SELF_CHECK_TOL or the benchmark stops. Returns the per-case results; with
    then_exit (the script's --self-check), exits after the check instead."""
    res = run_worker(script, {"method": "self_check"})
    if "error" in res:
        sys.exit(f"self-check failed: {res['error']}")
    worst = max(e for case in res["cases"] for e in case["rel_l2"].values())
    print(f"self-check against {what}: worst relative L2 {worst:.1e} "
          f"(tolerance {SELF_CHECK_TOL:.0e})", file=sys.stderr)
    if worst > SELF_CHECK_TOL:
        sys.exit(f"self-check failed: {json.dumps(res['cases'], indent=1)}")
    if then_exit:
        sys.exit()
    return res["cases"]
