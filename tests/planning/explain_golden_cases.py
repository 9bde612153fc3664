"""The geometries whose explain() tables are held in explain_golden.json (issue 37:
the restructure keeps every choice). Run as a script in a fresh process with
TFBIGCONV_COST_MODEL and TFBIGCONV_ISA=avx2 set (test_explain_golden.py does): prints one JSON object
{case id: table}. The host's facts are pinned (pinned_host) so that the tables do
not depend on the machine: oneDNN on or off as the case says, 2 workers."""
import json
import sys

# (input shape, filter shape, kwargs of explain); each runs on the CPU with oneDNN
# off and on, and on the GPU.
GEOMETRIES = [
    ((16, 321, 481, 1), (135, 135, 1, 3), dict(padding="VALID")),
    ((200, 321, 481, 1), (135, 135, 1, 3), dict(padding="VALID")),
    ((1, 70, 67, 1), (63, 63, 1, 3), dict(padding="SAME")),
    ((8, 56, 56, 128), (31, 31, 1, 128), dict(padding="SAME")),
    ((8, 56, 56, 128), (7, 7, 1, 128), dict(padding="SAME")),
    ((8, 56, 56, 64), (3, 3, 1, 64), dict(padding="SAME", dilations=6)),
    ((8, 64, 64, 64), (3, 3, 1, 64), dict(padding="SAME", dilations=18)),
    ((4, 128, 128, 32), (31, 31, 32, 32), dict(padding="SAME")),
    ((2, 128, 128, 32), (3, 3, 8, 32), dict(padding="SAME")),
    ((1, 224, 224, 1), (7, 7, 1, 3), dict(padding="SAME")),
    ((8, 321, 481, 1), (5, 5, 1, 3), dict(padding="VALID")),
    ((2, 40, 37, 3), (15, 15, 3, 5), dict(padding=[[0, 0], [3, 4], [0, 7], [0, 0]])),
    ((2, 3, 40, 37), (15, 15, 3, 5), dict(padding="SAME", data_format="NCHW")),
    ((2, 16, 33, 35), (9, 9, 1, 16), dict(padding="SAME", data_format="NCHW")),
    ((4, 97, 89, 6), (17, 13, 2, 9), dict(padding="VALID", strides=2)),
    ((4, 97, 89, 6), (17, 13, 6, 9), dict(padding="SAME", strides=[3, 2], dilations=1)),
    ((2, 60, 60, 4), (5, 5, 4, 8), dict(padding="SAME", dilations=[2, 3])),
    ((32, 28, 28, 16), (3, 3, 16, 32), dict(padding="SAME")),
    ((1, 512, 512, 3), (45, 45, 3, 3), dict(padding="SAME")),
    ((2, 64, 64, 8), (1, 1, 8, 16), dict(padding="VALID")),
    # 1-D (as bigconv1d: a 2-D convolution of height 1) and 3-D (as bigconv3d), issue 54.
    ((8, 16000, 1), (1024, 1, 1), dict(padding="SAME")),
    ((4, 4096, 32), (255, 1, 32), dict(padding="CAUSAL")),
    ((2, 16, 3000), (65, 16, 32), dict(padding="VALID", strides=2, data_format="NCW")),
    ((4, 1000, 8), (31, 2, 16), dict(padding=[[0, 0], [5, 7], [0, 0]], dilations=3)),
    ((2, 32, 64, 64, 4), (7, 7, 7, 4, 8), dict(padding="SAME")),
    ((1, 16, 8, 40, 40), (3, 9, 9, 16, 16), dict(padding="VALID", data_format="NCDHW")),
    ((2, 16, 20, 20, 8), (5, 5, 5, 4, 8), dict(padding="SAME", dilations=2)),
    ((1, 12, 30, 30, 2), (9, 9, 9, 2, 3),
     dict(padding=[[0, 0], [1, 2], [3, 4], [0, 5], [0, 0]], strides=2)),
    ((2, 8, 24, 24, 6), (3, 5, 5, 1, 6), dict(padding="SAME", dilations=[1, 2, 2, 1, 1])),
]
DTYPES = ("float32", "float16", "bfloat16", "float64")


def cases():
    """(id, input, filter, kwargs of explain): each geometry in every dtype on the
    CPU with oneDNN on and off, and in float32 and float16 on the GPU."""
    out = []
    for i, (x, w, kw) in enumerate(GEOMETRIES):
        for dtype in DTYPES:
            for onednn in (False, True):
                out.append((f"{i}-{dtype}-CPU-onednn{int(onednn)}", x, w,
                            dict(kw, dtype=dtype, device="CPU"), onednn))
        for dtype in ("float32", "float16"):
            out.append((f"{i}-{dtype}-GPU", x, w, dict(kw, dtype=dtype, device="GPU"), False))
    return out


def pinned_host(onednn):
    """This machine's facts, as the case says (the planner reads them)."""
    from tfbigconv import host
    return host.use(host.Host(onednn=onednn, gpu=False, workers=2,
                              onednn_runs=lambda *args: onednn))


def table(explanation):
    """explain's text without the lines about this machine."""
    return "\n".join(line for line in str(explanation).splitlines()
                     if not line.startswith("cost model"))


def main():
    import tfbigconv
    out = {}
    for case_id, x, w, kw, onednn in cases():
        with pinned_host(onednn):
            try:
                e = tfbigconv.explain(list(x), list(w), budget=8 << 30, autotune=False, **kw)
                out[case_id] = table(e)
            except Exception as error:  # noqa: BLE001 - the error is part of the golden output
                out[case_id] = f"{type(error).__name__}: {error}"
    json.dump(out, sys.stdout, indent=0, sort_keys=True)


if __name__ == "__main__":
    main()
