"""`serve`: the model folder's handler (code/inference.py's model_fn / input_fn / predict_fn / output_fn)
behind SageMaker's inference contract for a container that brings its own server, without TorchServe: HTTP
on port 8080, GET /ping answers 200 once the model is loaded, POST /invocations answers one request with the
handler's JSON (a RequestRefused with its 4xx status and one-line reason, anything else 500). SageMaker
starts such a container as `docker run IMAGE serve` with the model at /opt/ml/model.

    python3 -m yolov5_smddp.serving.server [--model-dir /opt/ml/model] [--host 0.0.0.0] [--port 8080]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

MODEL_DIR = "/opt/ml/model"
PORT = 8080
MAX_BODY_BYTES = 6 * 2**20  # SageMaker's real-time endpoints take 6 MB payloads at most


def load_handler(model_dir: Path) -> ModuleType:
    """The model folder's code/inference.py as a module (the handler it was trained with), else ours."""
    path = Path(model_dir) / "code" / "inference.py"
    if not path.is_file():
        from yolov5_smddp.serving import inference

        return inference
    spec = importlib.util.spec_from_file_location("yolov5_smddp_model_handler", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_server(model_dir: Path, host: str = "0.0.0.0", port: int = PORT) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) over the model in `model_dir`; one request runs the model at a time."""
    handler = load_handler(model_dir)
    model = handler.model_fn(str(model_dir))
    lock = threading.Lock()

    class Endpoint(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.split("?")[0] == "/ping":
                self._answer(HTTPStatus.OK, b"{}")
            else:
                self._answer(HTTPStatus.NOT_FOUND, b'{"error": "not found"}')

        def do_POST(self) -> None:  # noqa: N802
            if self.path.split("?")[0] != "/invocations":
                self._answer(HTTPStatus.NOT_FOUND, b'{"error": "not found"}')
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, b'{"error": "request body over 6 MB"}')
                self.close_connection = True
                return
            body = self.rfile.read(length)
            try:
                data = handler.input_fn(body, self.headers.get("Content-Type", ""))
                with lock:
                    prediction = handler.predict_fn(data, model)
                answer = handler.output_fn(prediction, self.headers.get("Accept", "application/json"))
            except handler.RequestRefused as exc:
                self._answer(exc.status_code, exc.message.encode(), "text/plain; charset=utf-8")
                return
            except Exception as exc:  # the contract: any other failure is a 500 with one line
                log.exception("invocation failed")
                self._answer(
                    HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}".encode(), "text/plain"
                )
                return
            self._answer(HTTPStatus.OK, answer.encode())

        def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
            log.info("%s %s", self.address_string(), format % args)

    return ThreadingHTTPServer((host, port), Endpoint)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default=MODEL_DIR)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    server = make_server(Path(args.model_dir), args.host, args.port)
    print(
        f"[yolov5-smddp] serving {args.model_dir} on {args.host}:{args.port} (/ping, /invocations)",
        flush=True,
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
