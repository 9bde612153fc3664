"""examples/train_big_filter.py, on a smaller problem: the loss falls, the filter is learned."""
import importlib.util
import os

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "train_big_filter.py")


def test_train_big_filter(tmp_path):
    spec = importlib.util.spec_from_file_location("train_big_filter", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    png = tmp_path / "filter.png"
    result = example.main(["--size", "31", "--images", "16", "--image-size", "64",
                           "--epochs", "12", "--lr", "0.1", "--out", str(png)])
    losses = result["losses"]
    assert losses[-1] < 0.01 * losses[0], losses
    assert result["filter_error"] < 0.1
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
