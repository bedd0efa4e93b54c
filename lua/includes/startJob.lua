-- @include "emitEvent"
-- @include "jobFields"
-- @include "metrics"
-- @include "groups"
-- @include "dedupe"
-- @include "brokenKeys"

-- Set `field` to `value` in a flat HGETALL list (appending it when absent).
local function setFlat(flat, field, value)
  for i = 1, #flat, 2 do
    if flat[i] == field then
      flat[i + 1] = value
      return
    end
  end
  flat[#flat + 1] = field
  flat[#flat + 1] = value
end

-- moveToActive's start of one job it took: `id`, just moved to `activeKey`,
-- of `group` (nil: none). A job that cannot start leaves `activeKey` for
-- `failedKey` with a reason: a key of another type than a hash, no hash, or
-- an `exp` (addJob: its expiry) before `now` ("expired", counted as failed in
-- the metrics, its dedupe key released). Any other is locked with `token`
-- until `lapsesAt` (its lock key: the caller adds the id to the lock index),
-- given its start's fields (`ats`, `processedOn`, `tok`, `wid`, `wids` with
-- `workerId`; on its first start `startedOn`, its wait counted in the
-- metrics), counted against its group's cap, and announced ("active").
-- Returns the job hash as a flat field/value list after the update, or nil
-- and whether the job expired.
local function startJob(prefix, activeKey, failedKey, id, group, token, workerId, now, lapsesAt)
  local jobKey = prefix .. id
  local flat = redis.pcall("HGETALL", jobKey)
  if flat["err"] then
    -- A job key of another type (written by some other client): it cannot
    -- run, and an error here would strand the jobs already taken.
    redis.call("LREM", activeKey, 1, id)
    failKeyOfWrongType(prefix, failedKey, id, now)
    return nil, false
  elseif #flat == 0 then
    -- An id with no job hash behind it (written by some other client):
    -- nothing can run it, so it is failed with a reason rather than dropped.
    redis.call("LREM", activeKey, 1, id)
    moveToFailed(prefix, failedKey, id, "job hash was missing when a worker fetched the id", now)
    return nil, false
  end
  local ats, wids, startedOn, readyAt, due, expiresAt
  for i = 1, #flat, 2 do
    local field = flat[i]
    if field == "ats" then ats = flat[i + 1]
    elseif field == "wids" then wids = flat[i + 1]
    elseif field == "startedOn" then startedOn = flat[i + 1]
    elseif field == "timestamp" then readyAt = flat[i + 1]
    elseif field == "due" then due = flat[i + 1]
    elseif field == "exp" then expiresAt = tonumber(flat[i + 1]) end
  end
  if expiresAt and expiresAt < now then
    -- Not started by its expiry (addJob's `exp`): it never starts. (Taken by its group's turn, it held no slot.)
    redis.call("LREM", activeKey, 1, id)
    moveToFailed(prefix, failedKey, id, "expired", now)
    dedupeRelease(prefix, id)
    countMetric("failed", 1)
    return nil, true
  end
  -- PXAT: the lock lapses at exactly the time the index records (every id
  -- taken enters the index in one ZADD at the end of the call).
  redis.call("SET", jobKey .. ":lock", token, "PXAT", lapsesAt)
  -- Read-and-write rather than HINCRBY: a corrupt `ats` must not abort the
  -- script halfway through its writes.
  local update = {"ats", (parseCounter(ats, "ats") or 0) + 1, "processedOn", now, "tok", token,
    "wid", workerId, "wids", appendToJsonList(wids, workerId, 1000)}
  if not startedOn then
    update[#update + 1] = "startedOn"
    update[#update + 1] = now
    readyAt = tonumber(due) or tonumber(readyAt)
    if readyAt then timeMetric("wait", now - readyAt) end
  end
  redis.call("HSET", jobKey, unpack(update))
  if group and not groupStarted(prefix, id, group) then
    reportWrongType(prefix .. "group-running", "hash", "the jobs of groups started meanwhile hold their slots " ..
      "until a sweep after it is deleted")
  end
  for i = 1, #update, 2 do setFlat(flat, update[i], tostring(update[i + 1])) end
  emitEvent(prefix, "active", id)
  return flat
end
