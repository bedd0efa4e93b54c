-- Append one lifecycle event to the queue's capped stream.
local function emitEvent(prefix, event, id, ...)
  redis.call("XADD", prefix .. "events", "MAXLEN", "~", 10000, "*",
    "event", event, "jobId", id, ...)
end
