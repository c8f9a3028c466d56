"""`serve`: the model folder's handler behind SageMaker's bring-your-own-server contract (GET /ping, POST
/invocations on 8080), no TorchServe. A real HTTP server on 127.0.0.1 (a free port), real requests."""

from __future__ import annotations

import http.client
import json
import threading

import cv2
import numpy as np
import pytest

from yolov5_smddp import serving
from yolov5_smddp.models.yolo import build_model
from yolov5_smddp.serving import server


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model")
    serving.write_model_folder(folder, build_model("yolov5n", nc=3).eval(), 64)
    httpd = server.make_server(folder, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield folder, httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def _request(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


def test_ping_answers_200_once_the_model_is_loaded(endpoint):
    _, port = endpoint
    assert _request(port, "GET", "/ping")[0] == 200
    assert _request(port, "GET", "/other")[0] == 404


def test_an_invocation_answers_what_the_handler_computes(endpoint):
    folder, port = endpoint
    image = np.random.default_rng(0).integers(0, 256, (48, 80, 3), dtype=np.uint8)
    ok, jpeg = cv2.imencode(".jpg", image)
    assert ok
    status, kind, body = _request(
        port, "POST", "/invocations", jpeg.tobytes(), {"Content-Type": "image/jpeg"}
    )
    assert status == 200 and kind == "application/json", body
    handler = server.load_handler(folder)
    model = handler.model_fn(str(folder))
    expected = handler.predict_fn(handler.input_fn(jpeg.tobytes(), "image/jpeg"), model)
    assert json.loads(body) == json.loads(json.dumps(expected))
    assert json.loads(body)["width"] == 80 and json.loads(body)["height"] == 48


def test_a_refused_request_gets_its_4xx_and_one_line(endpoint):
    _, port = endpoint
    status, _, body = _request(port, "POST", "/invocations", b"not an image", {"Content-Type": "text/csv"})
    assert 400 <= status < 500
    assert b"\n" not in body.strip() and body
