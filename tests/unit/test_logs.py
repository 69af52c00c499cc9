"""Log output: the same sentence in both formats; JSON carries the parts as fields."""

from __future__ import annotations

import io
import json
import logging
import logging.config

from rig_conductor import logs


def _capture(log_format: str) -> tuple[logging.Logger, io.StringIO]:
    config = logs.config(log_format)
    stream = io.StringIO()
    config["handlers"]["stderr"]["stream"] = stream
    logging.config.dictConfig(config)
    return logging.getLogger("rig_conductor.reaper.cycle"), stream


def test_json_lines_carry_message_and_fields() -> None:
    logger, stream = _capture("json")
    logger.info(
        "[StreamReclaim] Reclaimed %s on %s: %s -> %s",
        "1-0",
        "rig:dispatch",
        "a-0",
        "b-0",
        extra={
            "entryId": "1-0",
            "stream": "rig:dispatch",
            "fromConsumer": "a-0",
            "toConsumer": "b-0",
        },
    )
    line = json.loads(stream.getvalue())
    assert line["message"] == "[StreamReclaim] Reclaimed 1-0 on rig:dispatch: a-0 -> b-0"
    assert line["level"] == "INFO"
    assert (line["entryId"], line["stream"], line["fromConsumer"], line["toConsumer"]) == (
        "1-0",
        "rig:dispatch",
        "a-0",
        "b-0",
    )
    assert "args" not in line and "msg" not in line


def test_text_lines_end_with_the_sentence() -> None:
    logger, stream = _capture("text")
    logger.info("[StreamReclaim] Dead-lettered %s on %s after %d deliveries", "1-0", "s", 5)
    assert (
        stream.getvalue()
        .rstrip()
        .endswith("[StreamReclaim] Dead-lettered 1-0 on s after 5 deliveries")
    )
