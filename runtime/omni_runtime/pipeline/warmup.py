"""A session's history prefilled into its kept KV ahead of its next turn (conversation KV).

A realtime session's next prompt is its history plus what the user is saying now. The history
usually is in the session's kept KV already (the previous turn's prompt and reply), but not
after a barge-in or a truncation (the kept reply runs past what the user heard), after an edit of
an earlier item, or after the entry was evicted. ``warm_prefix`` runs the history through the
thinker while the user still speaks (one row, one sampled token that is thrown away), so the
row ends and its KV is kept: when the turn ends, only the new audio remains to prefill. The
prefix rule of conversation_kv.py decides, as for any turn, how much of the kept KV a prompt
may use, so a warm-up can never change an answer.
"""

from __future__ import annotations

from omni_runtime.contract.engine import GenerationRequest
from omni_runtime.pipeline.encoding import MediaEncoders
from omni_runtime.pipeline.scheduler import ThinkerDone, ThinkerJob
from omni_runtime.pipeline.stage_set import StageSet
from omni_runtime.pipeline.validate import row_sampling


async def warm_prefix(
    request: GenerationRequest, *, stages: StageSet, encoders: MediaEncoders, want_vectors: bool
) -> int:
    """Prefill ``request``'s prompt as its session's kept KV; returns the prompt tokens it reused."""
    prompt = await stages.preprocess(request)
    audio, image, video = await encoders.encode(prompt)
    thinker_prompt = await stages.aggregate(prompt, audio=audio, image=image, video=video)
    job = ThinkerJob(
        request_id=request.request_id,
        prompt=thinker_prompt,
        sampling=row_sampling(request.sampling),
        max_tokens=1,
        want_vectors=want_vectors,
        session=request.session_key,
    )
    stages.thinker.submit(job)
    try:
        while not isinstance(await job.events.get(), ThinkerDone):
            pass
    finally:
        if job.finish is None:  # cancelled while queued or prefilling
            stages.thinker.finish(job, "cancelled")
    return job.reused
