"""The public gRPC data API (OpenData, PushRows, QueryData, ..., Subscribe) of `headstart.v1.Headstart`.

A mixin of the gateway's servicer (services/gateway/grpc_server.py), which
provides `service`, `_tenant` and `_abort`. Failures are statuses with the
exact code in trailing metadata `headstart-error-code`, as on the other calls.
"""

from __future__ import annotations

import json

from headstart.client.errors import ApiError
from headstart.v1 import headstart_pb2
from services.gateway.data_wire import answer_proto, description_proto, flash_proto, proto_rows
from services.gateway.grpc_wire import checked

EDGE = "grpc"


class DataServicerMixin:
    """The data RPCs; each authenticates, calls `service.data` and maps ApiError to a status."""

    async def OpenData(self, request, context):  # noqa: N802
        try:
            r = checked(request)
            out = await self.service.data.open(self._tenant(context), r.db, r.retention, r.retention_tokens,
                                               r.buffer_rows)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.OpenDataResponse(**out)

    async def PushRows(self, request_iterator, context):  # noqa: N802
        """Each message is one push (validated, logged, forwarded in order; its `push_id` makes a retry
        of it answer with the earlier ack); one summed ack at the end."""
        seqs, dropped, dropped_seqs, replayed, last = [], 0, [], 0, None
        try:
            tenant = self._tenant(context)
            async for request in request_iterator:
                r = checked(request)
                self.service.metrics.messages.labels(EDGE, "data_push").inc()
                ack = await self.service.data.push(tenant, r.session_id, proto_rows(r.rows), r.push_id or None)
                seqs += ack["seqs"]
                replayed += ack["replayed"]
                dropped += ack["dropped"]
                dropped_seqs += ack["dropped_seqs"]
                last = ack
        except ApiError as exc:
            if seqs:  # what this stream pushed before the failure stays pushed: say so
                exc = ApiError(exc.code, f"{exc.message} (rows before this message were pushed: "
                                         f"seqs {seqs[0]}..{seqs[-1]})", retry_after_s=exc.retry_after_s)
            await self._abort(context, exc)
        return headstart_pb2.DataPushAck(seqs=seqs, dropped=dropped, dropped_seqs=dropped_seqs,
                                         dropped_total=last["dropped_total"] if last else 0,
                                         buffered=last["buffered"] if last else 0, replayed_pushes=replayed)

    async def QueryData(self, request, context):  # noqa: N802
        try:
            r = checked(request)
            execute = r.execute if r.HasField("execute") else True
            answer = await self.service.data.query(self._tenant(context), r.session_id, r.question,
                                                   r.max_new_tokens or None, execute)
        except ApiError as exc:
            await self._abort(context, exc)
        return answer_proto(answer)

    async def DescribeData(self, request, context):  # noqa: N802
        try:
            out = await self.service.data.describe(self._tenant(context), checked(request).session_id)
        except ApiError as exc:
            await self._abort(context, exc)
        return description_proto(out)

    async def CloseData(self, request, context):  # noqa: N802
        try:
            await self.service.data.close(self._tenant(context), checked(request).session_id)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.CloseDataResponse()

    async def RegisterFlash(self, request, context):  # noqa: N802
        try:
            r = checked(request)
            out = await self.service.data.register_flash(self._tenant(context), r.session_id, r.question)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.FlashQuestion(id=out["id"], question=out["question"])

    async def ListFlash(self, request, context):  # noqa: N802
        try:
            items = await self.service.data.list_flash(self._tenant(context), checked(request).session_id)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.ListFlashResponse(questions=[flash_proto(i) for i in items])

    async def DeleteFlash(self, request, context):  # noqa: N802
        try:
            r = checked(request)
            await self.service.data.delete_flash(self._tenant(context), r.session_id, r.id)
        except ApiError as exc:
            await self._abort(context, exc)
        return headstart_pb2.DeleteFlashResponse()

    async def Subscribe(self, request, context):  # noqa: N802
        """Events after `last_event_id` (empty: from now on) until the client cancels or the session closes;
        a resume id outside what is kept is OUT_OF_RANGE (naming the oldest id kept), Redis away UNAVAILABLE."""
        try:
            r = checked(request)
            tenant = self._tenant(context)
            stream = await self.service.data.subscribe(tenant, r.session_id, r.last_event_id or None)
            self.service.quotas.connections.acquire(tenant)
        except ApiError as exc:
            await self._abort(context, exc)
            return
        # "Now" is fixed: say so at once (the client returns from subscribe() on these headers,
        # so whatever it does next is an event it will see).
        await context.send_initial_metadata(())
        try:
            async for item in stream:
                if item is not None:
                    event_id, kind, payload = item
                    yield headstart_pb2.DataEvent(id=event_id, kind=kind, payload_json=json.dumps(payload))
        except ApiError as exc:  # Redis went away: UNAVAILABLE (retry from the last id), never a silent OK
            await self._abort(context, exc)
        finally:
            self.service.quotas.connections.release(tenant)
            await stream.aclose()
