"""`omni serve`: one worker — every local stage of the pipeline behind the OpenAI-compatible API.

Flags mirror the field's launchers (--model-path, --thinker-tp-size, --talker-gpu, ...). With no
--model-path the tiny random-weight checkpoint is created once in the cache directory and served,
so a newcomer gets a working worker with one command. Bad flags exit 2 with a message naming the
flag; a worker that fails to start exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from omni_runtime.contract import switches
from omni_runtime.contract.options import DEFAULT_SESSION_KV_MB, EngineOptions
from omni_runtime.contract.stages import STAGES
from omni_runtime.contract.workers import DEFAULT_MAX_SPEECH_STREAMS
from omni_runtime.entrypoints.streaming_input_flags import add_streaming_input_flags, realtime_settings
from omni_runtime.media.limits import MediaLimits
from omni_runtime.router.head_limit import DEFAULT_MAX_HEADER_BYTES, head_limited_protocol
from omni_runtime.support.cli_types import non_negative_int, positive_float, positive_int

log = logging.getLogger("omni.serve")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_HOST_PORT = re.compile(r"^(?P<host>[A-Za-z0-9.\-\[\]:]+):(?P<port>\d{1,5})$")


def gpu_list(text: str) -> tuple[int, ...]:
    """``0,1`` or ``[0, 1]`` -> (0, 1): pod-local GPU ids."""
    raw = text.strip()
    try:
        items = json.loads(raw) if raw.startswith("[") else [p for p in raw.split(",") if p.strip()]
        ids = tuple(int(i) for i in items)
    except (ValueError, TypeError) as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU list; use 0,1 or [0,1]") from exc
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"{text!r} must list distinct GPU ids >= 0")
    return ids


def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port (1-65535)")
    return value


def _gpu_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU id") from exc
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def _remote_stage(text: str) -> tuple[str, str]:
    stage, sep, address = text.partition("=")
    if not sep or stage not in STAGES:
        raise argparse.ArgumentTypeError(
            f"{text!r} must be STAGE=HOST:PORT with STAGE one of {', '.join(STAGES)}"
        )
    match = _HOST_PORT.match(address)
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise argparse.ArgumentTypeError(f"{address!r} in {text!r} is not HOST:PORT")
    return stage, address


def _worker_id(text: str) -> str:
    if not _DNS_LABEL.match(text) or len(text) > 63:
        raise argparse.ArgumentTypeError(f"{text!r} must be a DNS label (lowercase letters, digits, '-')")
    return text


def engine_options(args: argparse.Namespace, *, remote_stages: dict[str, str]) -> EngineOptions:
    """The engine options of parsed `omni serve` flags (`omni stage` shares them)."""
    pipeline = "text" if args.text_only else (args.pipeline or "speech")
    return EngineOptions(
        model_path=args.model_path,
        tiny_family=args.tiny_family or "qwen2_5_omni",
        model_name=args.model_name,
        pipeline=pipeline,
        text_only=pipeline == "text",
        load_format=args.load_format,
        device=args.device,
        dtype=args.dtype,
        thinker_tp_size=args.thinker_tp_size,
        thinker_gpus=tuple(args.thinker_gpus),
        talker_gpu=args.talker_gpu,
        image_encoder_tp_size=args.image_encoder_tp_size,
        image_encoder_gpus=tuple(args.image_encoder_gpus),
        mem_fraction_static=args.mem_fraction_static,
        max_batch_size=args.max_batch_size,
        max_model_len=args.max_model_len,
        encoder_cache_mb=args.encoder_cache_mb,
        session_kv_mb=args.session_kv_mb,
        remote_stages=remote_stages,
        worker_id=args.worker_id,
        revision=args.revision,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omni serve", description="Run one worker: every stage behind the OpenAI API."
    )
    model = p.add_argument_group("model")
    model.add_argument(
        "--model-path", help="checkpoint directory; omitted: the tiny random-weight checkpoint"
    )
    model.add_argument(
        "--tiny-family",
        choices=["qwen2_5_omni", "qwen3_omni_moe"],
        default=None,
        help="without --model-path: the family whose tiny checkpoint to write and serve (default"
        " qwen2_5_omni); a checkpoint's own config.json names its family",
    )
    model.add_argument("--model-name", help="served model name (default: the checkpoint directory name)")
    model.add_argument("--revision", default="dev", help="worker revision reported by the API (default: dev)")
    model.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default="auto",
        help="dummy: the checkpoint's config at full size with random weights (benchmarks)",
    )
    model.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    pipe = p.add_argument_group("pipeline and placement")
    pipe.add_argument(
        "--pipeline",
        choices=["text", "speech", "streaming-speech", "duplex"],
        default=None,
        help="pipeline variant (default: speech); duplex is streaming-speech whose /v1/realtime sessions "
        "are full duplex unless a client asks ?duplex=0",
    )
    pipe.add_argument("--text-only", action="store_true", help="no talker: same as --pipeline text")
    pipe.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    pipe.add_argument("--thinker-tp-size", type=positive_int, default=1)
    pipe.add_argument("--thinker-gpus", type=gpu_list, default=(), help="pod-local ids: 0,1 or [0,1]")
    pipe.add_argument("--talker-gpu", type=_gpu_id, default=None)
    pipe.add_argument(
        "--image-encoder-tp-size",
        type=positive_int,
        default=1,
        help="vision-tower TP ranks; above 1 the image encoder runs in a stage process of its own",
    )
    pipe.add_argument("--image-encoder-gpus", type=gpu_list, default=(), help="one id per rank")
    pipe.add_argument("--mem-fraction-static", type=_fraction, default=None)
    pipe.add_argument(
        "--max-batch-size", type=positive_int, default=32, help="thinker continuous-batching slots"
    )
    pipe.add_argument("--max-model-len", type=positive_int, default=8192)
    pipe.add_argument(
        "--encoder-cache-mb",
        type=non_negative_int,
        default=256,
        help="encoder outputs kept by content, for media encoded ahead of its request (streaming input) and"
        " repeated media; 0: off",
    )
    pipe.add_argument(
        "--session-kv-mb",
        type=non_negative_int,
        default=DEFAULT_SESSION_KV_MB,
        help="MiB of thinker KV kept between a session's turns (realtime, duplex, chat with X-Session-Id),"
        " so a turn prefills only what is new, and as much again for the talker's KV of its prompt;"
        " least recently used sessions evicted first; 0: off, every turn prefills the whole conversation"
        " (on an H100 the default lowered the median wait for first audio at 8 realtime sessions by"
        " 20-50 ms, with the same tail)",
    )
    pipe.add_argument(
        "--remote-stage",
        type=_remote_stage,
        action="append",
        default=[],
        metavar="STAGE=HOST:PORT",
        help="this stage runs in another process behind a stage link (repeatable)",
    )
    pipe.add_argument("--worker-id", type=_worker_id, default="worker-0")
    pipe.add_argument(
        "--cpu-threads",
        type=positive_int,
        default=None,
        help="torch CPU threads in this process (default: 1 when the stages run on a GPU, where a pool of"
        " spinning threads only takes cores; all cores on the CPU; OMP_NUM_THREADS is honoured)",
    )
    http = p.add_argument_group("HTTP")
    http.add_argument("--host", default="0.0.0.0")
    http.add_argument("--port", type=_port, default=8000)
    http.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    http.add_argument("--no-warmup", action="store_true", help="report ready without a warm-up generation")
    http.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="keep startup objects in the garbage collector's full passes (default: frozen once ready,"
        " which keeps full collections from stopping a loaded worker for ~0.3 s)",
    )
    limits = p.add_argument_group("request limits")
    defaults = MediaLimits()
    limits.add_argument(
        "--max-tokens-limit",
        type=positive_int,
        default=None,
        help="largest max_tokens a request may ask for (default: --max-model-len)",
    )
    limits.add_argument("--default-max-tokens", type=positive_int, default=2048)
    limits.add_argument(
        "--max-speech-streams",
        type=non_negative_int,
        default=DEFAULT_MAX_SPEECH_STREAMS,
        help="concurrent speech streams (chat with audio out, realtime and video sessions) this worker"
        " admits; past it new ones get 429 / close 1013 and the router tries another worker; 0: no limit"
        f" (default {DEFAULT_MAX_SPEECH_STREAMS})",
    )
    limits.add_argument(
        "--max-header-bytes",
        type=positive_int,
        default=DEFAULT_MAX_HEADER_BYTES,
        help="largest request head (request line and headers) in bytes; larger ones get 431",
    )
    limits.add_argument("--max-media-bytes", type=positive_int, default=defaults.max_bytes)
    limits.add_argument("--max-audio-seconds", type=positive_float, default=defaults.max_audio_seconds)
    limits.add_argument("--max-video-seconds", type=positive_float, default=defaults.max_video_seconds)
    limits.add_argument("--max-video-frames", type=positive_int, default=defaults.max_video_frames)
    limits.add_argument("--max-image-pixels", type=positive_int, default=defaults.max_image_pixels)
    limits.add_argument("--media-fetch-timeout", type=positive_float, default=defaults.fetch_timeout_s)
    limits.add_argument("--no-remote-media", action="store_true", help="refuse http(s) media URLs")
    limits.add_argument(
        "--allowed-media-domain",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="fetch media URLs only from this host (exact name) or the names below it (*.example.com);"
        " repeatable; default: any public host",
    )
    limits.add_argument(
        "--allow-private-media-addresses",
        action="store_true",
        help="let media URLs reach loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7) and 100.64/10"
        " addresses, for media served inside your network (link-local, including the cloud metadata"
        " address, stays refused)",
    )
    limits.add_argument(
        "--deny-media-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="refuse media URLs whose host resolves into this range, always (e.g. the cluster's pod and"
        " Service ranges where they are public addresses); repeatable",
    )
    limits.add_argument(
        "--allowed-local-media-path",
        default=None,
        help="allow local media paths (and file:// URLs) below this directory",
    )
    add_streaming_input_flags(p)
    return p


@dataclass(frozen=True)
class ServeConfig:
    options: EngineOptions
    limits: MediaLimits
    args: argparse.Namespace


def parse_args(argv: list[str]) -> ServeConfig:
    """Flags -> engine options and limits; contradictions are argparse errors (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.text_only and args.pipeline not in (None, "text"):
        parser.error(f"--text-only contradicts --pipeline {args.pipeline}; use one of them")
    if args.thinker_gpus and len(args.thinker_gpus) != args.thinker_tp_size:
        parser.error(
            f"--thinker-gpus lists {len(args.thinker_gpus)} GPUs but --thinker-tp-size is {args.thinker_tp_size}; "
            "give one GPU per rank"
        )
    if args.image_encoder_gpus and len(args.image_encoder_gpus) != args.image_encoder_tp_size:
        parser.error(
            f"--image-encoder-gpus lists {len(args.image_encoder_gpus)} GPUs but --image-encoder-tp-size is "
            f"{args.image_encoder_tp_size}; give one GPU per rank"
        )
    if args.talker_gpu is not None and args.talker_gpu in args.thinker_gpus:
        parser.error(f"--talker-gpu {args.talker_gpu} is also a thinker GPU; the talker needs its own GPU")
    # Thinker ranks default to GPUs 0..tp-1 when --thinker-gpus is not given.
    if not args.thinker_gpus and args.talker_gpu is not None and 0 < args.talker_gpu < args.thinker_tp_size:
        parser.error(
            f"--talker-gpu {args.talker_gpu} is thinker TP rank {args.talker_gpu}'s GPU (without --thinker-gpus "
            f"the {args.thinker_tp_size} ranks use GPUs 0-{args.thinker_tp_size - 1}); pick another GPU or "
            "list --thinker-gpus"
        )
    if args.device == "cpu" and (args.thinker_gpus or args.talker_gpu is not None or args.image_encoder_gpus):
        parser.error("--device cpu contradicts the GPU placement flags; drop them or use --device cuda")
    if args.max_tokens_limit is not None and args.max_tokens_limit > args.max_model_len:
        parser.error(
            f"--max-tokens-limit {args.max_tokens_limit} exceeds --max-model-len {args.max_model_len}"
        )
    if args.model_path is not None and args.tiny_family is not None:
        parser.error(
            "--tiny-family applies only without --model-path (the checkpoint's config.json names its family);"
            " drop one of them"
        )
    if args.model_path is None and args.load_format == "dummy":
        parser.error("--load-format dummy needs --model-path (a directory with the config to build)")
    stages = [stage for stage, _ in args.remote_stage]
    if len(set(stages)) != len(stages):
        parser.error("--remote-stage names the same stage twice")
    options = engine_options(args, remote_stages=dict(args.remote_stage))
    try:  # MediaLimits checks the domains and ranges; its message names the flag
        limits = MediaLimits(
            max_bytes=args.max_media_bytes,
            max_audio_seconds=args.max_audio_seconds,
            max_video_seconds=args.max_video_seconds,
            max_video_frames=args.max_video_frames,
            max_image_pixels=args.max_image_pixels,
            fetch_timeout_s=args.media_fetch_timeout,
            allow_remote_urls=not args.no_remote_media,
            allowed_domains=tuple(args.allowed_media_domain),
            allow_private_addresses=args.allow_private_media_addresses,
            denied_networks=tuple(args.deny_media_network),
            allowed_local_media_path=args.allowed_local_media_path,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return ServeConfig(options=options, limits=limits, args=args)


def curl_example(*, host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url = f"http://{shown}:{port}"
    body = '{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":32}'
    return f"{url} — try: curl -s {url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def main(argv: list[str]) -> int:
    config = parse_args(argv)  # argparse exits 2 on bad flags
    args = config.args
    if wrong := switches.problems(os.environ):  # before anything loads: a wrong switch is not the default
        print(f"omni serve: {'; '.join(wrong)}", file=sys.stderr)
        return 2
    if config.options.model_path:  # before anything binds or loads: a directory with no checkpoint
        from omni_runtime.contract.engine import EngineError
        from omni_runtime.models.registry import resolve_model_path

        try:
            resolve_model_path(config.options)
        except EngineError as exc:
            print(f"omni serve: error: {exc}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(
            f"omni serve: cannot listen on {args.host}:{args.port}: {exc.strerror}; pick another --port",
            file=sys.stderr,
        )
        return 1

    # Heavy imports (torch, transformers) only now, after the flags are known to be good.
    import uvicorn

    from omni_runtime.api import ApiSettings, build_app
    from omni_runtime.contract.engine import EngineError
    from omni_runtime.entrypoints.console import end_process, quiet_probes
    from omni_runtime.models.qwen2_5_omni.tiny import is_tiny_checkpoint
    from omni_runtime.models.registry import ensure_tiny
    from omni_runtime.pipeline import build_engine
    from omni_runtime.support.cpu_threads import apply_cpu_threads

    options = config.options
    apply_cpu_threads(device=options.device, requested=args.cpu_threads)
    if options.model_path is None:
        log.info("no --model-path: serving the tiny random-weight checkpoint (created once in the cache)")
        options = _with_model_path(options, str(ensure_tiny(options.tiny_family, progress=True)))
    from omni_runtime.models.qwen3_omni_moe.tiny import is_tiny_checkpoint as is_tiny_qwen3

    served = options.model_path or ""
    random_weights = options.load_format == "dummy" or is_tiny_checkpoint(served) or is_tiny_qwen3(served)
    try:
        engine = build_engine(options)
    except (EngineError, ValueError, FileNotFoundError) as exc:
        print(f"omni serve: cannot build the engine: {exc}", file=sys.stderr)
        return 1
    settings = ApiSettings(
        served_model_name=args.model_name,
        max_tokens_limit=args.max_tokens_limit,
        default_max_tokens=args.default_max_tokens,
        media=config.limits,
        random_weights=random_weights,
        model_path=options.model_path,
        worker_id=args.worker_id,
        revision=args.revision,
        warmup=not args.no_warmup,
        gc_freeze=not args.no_gc_freeze,
    )
    failed: list[BaseException] = []
    server: uvicorn.Server | None = None
    server_class = _graceful_server_class()

    def on_startup_failure(exc: BaseException) -> None:
        failed.append(exc)
        if server is not None:
            server.should_exit = True

    app = build_app(
        engine=engine,
        settings=settings,
        realtime_settings=realtime_settings(args, limits=config.limits),
        on_startup_failure=on_startup_failure,
    )
    uvicorn_config = uvicorn.Config(
        app,
        log_level=args.log_level,
        timeout_graceful_shutdown=10,
        http=head_limited_protocol(args.max_header_bytes),  # 431 for heads over the limit
    )
    server = server_class(uvicorn_config)
    quiet_probes()  # after uvicorn.Config set up its loggers: no access line per successful probe
    log.info(
        "omni serve: %s (model %s, pipeline %s, ready at /ready)",
        curl_example(host=args.host, port=args.port),
        settings.served_model_name or engine.model_name,
        options.pipeline,
    )
    server.run(sockets=[sock])
    code = 0
    if failed:
        print(f"omni serve: the worker failed to start: {failed[0]}", file=sys.stderr)
        code = 1
    from omni_runtime.executor.tp_group import end_process_if_nccl

    end_process_if_nccl(code)  # thinker TP on GPUs: end without the NCCL teardown
    end_process(code)  # stopped in order: skip the teardown of the frozen heap (entrypoints.console)


def _graceful_server_class() -> type:
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, so the process dies by the
        signal (exit -15). A worker that drained and stopped cleanly exits 0 instead; supervisors
        (`omni up`, the kubelet) then see a clean stop, not a crash."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return GracefulServer


def _with_model_path(options: EngineOptions, path: str) -> EngineOptions:
    from dataclasses import replace

    return replace(options, model_path=path)
