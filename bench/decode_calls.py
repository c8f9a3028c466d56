"""Per-image cost of the ways to decode a JPEG with OpenCV, on the same files, alternating per file.

`cv2.imread(path)` against `cv2.imdecode` of the file's bytes (`np.fromfile`, as the release does, or one
`read()`, as `data.decode.decode_image` does); all give the same pixels. The calls take turns on each file
(the order reversed every other file and repeat), so a shared machine's load hits them alike; the median
over repeats is reported, and the per-repeat ratio imread / imdecode(read bytes).

    docker run --rm --cpus 2 -v $PWD:/src -w /src yolov5-smddp-test:dev python3 bench/decode_calls.py --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="synthetic 640x480 JPEGs (~70 KB)")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    import cv2
    import numpy as np

    from yolov5_smddp.benchmarks.data import resolve_data

    cv2.setNumThreads(1)

    def imdecode_read(path: Path):
        with open(path, "rb") as f:
            return cv2.imdecode(np.frombuffer(f.read(), np.uint8), cv2.IMREAD_COLOR)

    calls = {
        "imread": lambda path: cv2.imread(str(path), cv2.IMREAD_COLOR),
        "imdecode(np.fromfile)": lambda path: cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR),
        "imdecode(read bytes)": imdecode_read,
    }
    with tempfile.TemporaryDirectory(prefix="decode-calls-") as tmp:
        resolve_data("synthetic", args.images, Path(tmp))
        paths = sorted((Path(tmp) / "bench-data" / "images" / "train").glob("*.jpg"))
        for path in paths[:5]:
            first = calls["imread"](path)
            assert all(np.array_equal(first, call(path)) for call in calls.values()), path
        ms = {name: [] for name in calls}
        names = list(calls)
        for rep in range(args.repeats):
            spent = dict.fromkeys(calls, 0.0)
            for i, path in enumerate(paths):
                for name in names if (i + rep) % 2 == 0 else names[::-1]:
                    start = time.perf_counter()
                    calls[name](path)
                    spent[name] += time.perf_counter() - start
            for name in calls:
                ms[name].append(1000 * spent[name] / len(paths))
    for name, values in ms.items():
        print(
            f"{name:<24} median {statistics.median(values):.3f} ms/image  ({' '.join(f'{v:.2f}' for v in values)})"
        )
    ratios = [a / b for a, b in zip(ms["imread"], ms["imdecode(read bytes)"])]
    print(
        f"imread / imdecode(read bytes): median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
