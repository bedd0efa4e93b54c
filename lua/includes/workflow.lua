-- @include "callInChunks"
-- @include "constants"
-- @include "emitEvent"
-- @include "jobFields"
-- @include "pushReady"

-- Workflows (docs/workflows.md): a member's end is counted by the script that
-- ends it, in the same call. A member's hash names where its end goes: `nxt`,
-- a JSON list of edges {prefix, target, slot, kind}, and `af` ("1": a failure
-- counts as done, its error in place of a result). A target is a job of the
-- workflow that waits in `deferred` (hash field `deps`: how many inputs it
-- still waits for; its inputs gather in `<id>:in`, one field per slot), or the
-- workflow's own record `wf:<workflow>` (its result, in `wf:<workflow>:in`).
-- Kinds: "r" the member's result is an input of the target; "e" the target is
-- an error handler, made ready by the first failure that reaches it; "d" the
-- same, and the member is one of the ends of the handler's scope: once every
-- end succeeded, the handler is not needed and is deleted.
--
-- Each input is written with HSETNX under its slot, and `deps` goes down only
-- when that wrote it, so an end counted twice (a re-sent call, a hand-off
-- delivered twice) is counted once. A target takes inputs only while it is in
-- `deferred` (or, the record, until the workflow ended): a late input finds
-- nothing to do. An edge to another queue (another cluster slot) is handed off:
-- pushed to this queue's `handoff` list, from which a worker or the sweep
-- delivers it to the target's queue with `deliverWorkflow`, the same code.
--
-- One call delivers about WORKFLOW_DELIVERIES_PER_CALL (constants) edges in
-- its queue beyond the ends it was called for (a member's edges are
-- delivered whole, and a member has at most WORKFLOW_FAN_EDGES inline): a
-- failure spreading down a chain of 100,000 steps, or a member whose end
-- goes to 100,000 steps, would otherwise hold Redis for seconds. What is
-- left goes to the queue's own `handoff` list, as an edge to another queue
-- does: a member's edges whole (kind "c"), or the next page of a member
-- whose edges are in pages (kind "f", `<id>:nxt`: HASH, "n" pages, "0".. each
-- a JSON list of edges, deleted once its last page is delivered). The same
-- deliverers go on from there, a bounded call at a time: the outcome is the
-- one a single call would have had, each edge counted once.

local wfPrefix, wfNow, wfKeys, wfBudget = nil, 0, {}, 0

-- The queue keys the deliveries write; call once per script before the others.
local function workflowKeys(prefix, waitKey, pausedKey, metaKey, prioritizedKey, failedKey, now)
  wfPrefix, wfNow, wfBudget = prefix, now, WORKFLOW_DELIVERIES_PER_CALL
  wfKeys = {wait = waitKey, paused = pausedKey, meta = metaKey, prioritized = prioritizedKey,
            failed = failedKey, deferred = prefix .. "deferred", marker = prefix .. "marker",
            delayed = prefix .. "delayed", handoff = prefix .. "handoff"}
end

-- A deferred job whose last input came: ready now, or after its own delay (`dly`, ms).
local function releaseDeferred(id)
  local jobHash = wfPrefix .. id
  redis.call("ZREM", wfKeys.deferred, id)
  -- pcall: a job key of another type (another client's) is failed by pushReady, not raised on here
  local delay = tonumber(redis.pcall("HGET", jobHash, "dly") or "") or 0
  redis.pcall("HDEL", jobHash, "deps")
  if delay > 0 then
    redis.call("HSET", jobHash, "due", wfNow + delay)
    redis.call("ZADD", wfKeys.delayed, wfNow + delay, id)
    redis.call("ZADD", wfKeys.marker, 0, "0")
  else
    emitEvent(wfPrefix, "added", id)
    pushReady(wfPrefix, wfKeys.wait, wfKeys.paused, wfKeys.meta, wfKeys.marker, wfKeys.prioritized, id)
  end
end

-- Count one input of a step (`jobHash`, or the workflow's record: inputs in
-- `jobHash:in`, the count in its `deps`):
-- true when it was new and the last one, false when not; nil and a reason
-- when another client broke the keys (`:in` of another type, a `deps` that is
-- no whole number). Never raises: its caller ends jobs in the same call, and
-- Redis keeps a script's writes before an error.
local function countInput(jobHash, slot, value)
  local fresh = redis.pcall("HSETNX", jobHash .. ":in", slot, value)
  if type(fresh) ~= "number" then return nil, jobHash .. ":in is not a hash (another client's write)" end
  if fresh == 0 then return false end
  local left = redis.pcall("HINCRBY", jobHash, "deps", -1)
  if type(left) ~= "number" then
    return nil, "deps of " .. jobHash .. " is not a whole number (another client's write)"
  end
  return left <= 0
end

-- The workflow's record takes a terminal member's result, or its failure.
local function deliverToRecord(target, slot, passed, value)
  local recordKey = wfPrefix .. target
  local fields = redis.pcall("HMGET", recordKey, "status", "ttl")
  if fields["err"] or fields[1] ~= "waiting" then return end
  if passed then
    local last, broken = countInput(recordKey, slot, value)
    if broken then
      passed, value = false, broken
    elseif not last then
      return
    end
  end
  if passed then
    redis.call("HSET", recordKey, "status", "succeeded", "finishedOn", wfNow)
  else
    redis.call("HSET", recordKey, "status", "failed", "reason", value, "finishedOn", wfNow)
  end
  -- Ended: kept for its TTL (addWorkflow's ttl_ms), results included.
  local ttl = tonumber(fields[2])
  if ttl and ttl > 0 then
    redis.call("PEXPIRE", recordKey, ttl)
    redis.call("PEXPIRE", recordKey .. ":in", ttl)
  end
end

-- One edge's delivery in this queue. A failure that fails the target adds
-- the target to `ended`, whose own edges the caller then follows.
local function deliverEdge(target, slot, kind, passed, value, origin, ended)
  if string.sub(target, 1, 3) == "wf:" then return deliverToRecord(target, slot, passed, value) end
  if not redis.call("ZSCORE", wfKeys.deferred, target) then return end  -- started, failed or gone
  local jobHash = wfPrefix .. target
  local last, broken
  if passed and (kind == "r" or kind == "d") then
    last, broken = countInput(jobHash, kind == "d" and "d" .. slot or slot, kind == "d" and "1" or value)
    if broken then kind, passed, value = "r", false, broken end  -- it can never count its inputs: it fails
  end
  if kind == "r" and passed then
    if last then releaseDeferred(target) end
  elseif kind == "r" then  -- an input failed: this step never runs (`deps` stays: retryJob refuses it)
    redis.call("ZREM", wfKeys.deferred, target)
    if redis.call("TYPE", jobHash)["ok"] == "hash" then
      moveToFailed(wfPrefix, wfKeys.failed, target, value, wfNow)
    else
      failKeyOfWrongType(wfPrefix, wfKeys.failed, target, wfNow)
    end
    ended[#ended + 1] = {target, false, value, origin}
  elseif not passed then  -- an error handler's first failure: it runs, with the member's id and error
    redis.call("DEL", jobHash .. ":in")
    redis.call("HSET", jobHash .. ":in", "0", cjson.encode(origin), "1", cjson.encode(value))
    releaseDeferred(target)
  elseif kind == "d" then  -- an end of the handler's scope succeeded
    if last then
      redis.call("ZREM", wfKeys.deferred, target)
      redis.call("DEL", jobHash, jobHash .. ":in")
      emitEvent(wfPrefix, "removed", target, "by", "workflow")
    end
  end
end

-- A hand-off entry: an end for `target` of queue `prefix` (includes of deliverWorkflow).
local function handoffEntry(prefix, target, slot, kind, ok, text, origin)
  return cjson.encode({prefix, target, slot, kind, ok and 1 or 0, text, origin})
end

-- Deliver one member's end along `edges` (decoded): in this queue while the
-- call has budget, each edge to another queue handed off. An edge of kind "f"
-- says the member's edges are in pages (`<id>:nxt`, more than WORKFLOW_FAN_EDGES):
-- its first page is handed on, and delivered a page a call.
local function deliverEdges(edges, ok, text, origin, ended)
  local later = {}
  for _, edge in ipairs(edges) do
    if type(edge) == "table" and type(edge[1]) == "string" and type(edge[2]) == "string" then
      local slot, kind = tostring(edge[3] or ""), tostring(edge[4] or "r")
      if kind == "f" then
        later[#later + 1] = handoffEntry(wfPrefix, edge[2], "0", "f", ok, text, origin)
      elseif edge[1] == wfPrefix then
        wfBudget = wfBudget - 1
        deliverEdge(edge[2], slot, kind, ok, text, origin, ended)
      else
        later[#later + 1] = handoffEntry(edge[1], edge[2], slot, kind, ok, text, origin)
      end
    end
  end
  callInChunks("RPUSH", wfKeys.handoff, later)
end

-- `text` cut to `limit` bytes, at a character's start (UTF-8), saying how long it was.
local function cutText(text, limit)
  if #text <= limit then return text end
  local keep = limit
  while keep > 0 do
    local byte = string.byte(text, keep + 1)  -- the first byte left out: a continuation byte splits a character
    if byte < 0x80 or byte >= 0xC0 then break end
    keep = keep - 1
  end
  return string.sub(text, 1, keep) .. " [cut: " .. #text .. " bytes]"
end

-- Follow the edges of jobs that ended for good: each entry {id, passed,
-- value, origin[, nxt, af]}, value the result (JSON) of a completed job or the
-- reason a job failed, origin the member whose failure it is, nxt and af the
-- job's fields when the caller read them already. A failure that fails a
-- later step appends that step, whose edges are followed in turn. Once the
-- budget is spent, each member left is handed on whole, its edges (at most
-- WORKFLOW_FAN_EDGES, more are in pages) in one entry of kind "c".
local function followEnded(ended)
  local i = 1
  while i <= #ended do
    local member = ended[i]
    i = i + 1
    local nxt, af = member[5], member[6]
    if not nxt then
      local fields = redis.pcall("HMGET", wfPrefix .. member[1], "nxt", "af")
      if fields["err"] then fields = {} end
      nxt, af = fields[1], fields[2]
    end
    local decoded, edges = pcall(cjson.decode, nxt or "[]")
    if decoded and type(edges) == "table" then
      local ok, text = member[2], member[3]
      -- A member's own reason is carried on cut (WORKFLOW_REASON_BYTES): a failure spreading down a
      -- chain copies it into every step it fails, and a 1 MB error would be 1 MB a step.
      if not ok and member[4] == member[1] then text = cutText(tostring(text), WORKFLOW_REASON_BYTES) end
      if not ok and af == "1" then
        ok, text = true, cjson.encode({error = text, job = member[1]})
      elseif not ok and member[4] == member[1] then
        text = "member " .. member[1] .. " failed: " .. text
      end
      if wfBudget > 0 then
        deliverEdges(edges, ok, text, member[4], ended)
      else
        redis.call("RPUSH", wfKeys.handoff, handoffEntry(wfPrefix, member[1], nxt, "c", ok, text, member[4]))
      end
    end
  end
end

-- One handed-on entry of this queue (deliverWorkflow): "c", a member's
-- edges (in `slot`) to follow; "f", the page `slot` of a member's edges. A
-- call whose budget is spent hands it on again, unchanged.
local function deliverLater(target, slot, kind, ok, text, origin, ended)
  if wfBudget <= 0 then
    redis.call("RPUSH", wfKeys.handoff, handoffEntry(wfPrefix, target, slot, kind, ok, text, origin))
    return
  end
  local edges, pagesKey, page, pages = slot, nil, tonumber(slot), 0
  if kind == "f" then
    pagesKey = wfPrefix .. target .. ":nxt"
    local fields = redis.pcall("HMGET", pagesKey, slot, "n")
    if fields["err"] or not fields[1] or not page then return end  -- delivered already: its field is gone
    edges, pages = fields[1], tonumber(fields[2]) or 0
    -- Delivered once: an entry read by two deliverers (a worker and a sweep) finds its page gone the
    -- second time, and so hands on no second copy of the next one (copies would double each page).
    redis.call("HDEL", pagesKey, slot)
  end
  local decoded, list = pcall(cjson.decode, edges)
  if decoded and type(list) == "table" then deliverEdges(list, ok, text, origin, ended) end
  if pagesKey and page + 1 < pages then
    redis.call("RPUSH", wfKeys.handoff, handoffEntry(wfPrefix, target, tostring(page + 1), "f", ok, text, origin))
  elseif pagesKey then
    redis.call("DEL", pagesKey)
  end
end

-- A job of a workflow ended for good (`nxt`: its edges, read by the caller).
local function workflowEnded(id, passed, value, nxt, af)
  if nxt then followEnded({{id, passed, value, id, nxt, af}}) end
end

-- A job that failed for good, by whatever script: its workflow hears of it
-- (`reason`: why, else its `failedReason`).
local function workflowFailed(id, reason)
  local fields = redis.pcall("HMGET", wfPrefix .. id, "nxt", "af", "failedReason")
  if not fields["err"] then workflowEnded(id, false, reason or fields[3] or "failed", fields[1], fields[2]) end
end
