-- @include "emitEvent"
-- @include "constants"

-- Readers for the job hash fields that scripts decide on. They never raise: a
-- malformed field comes back as nil plus a reason, so the caller can fail that
-- one job with a clear failedReason instead of aborting the whole script
-- (Redis keeps the writes a script made before an error).

-- An integer counter field (atm, ats, stc) from its raw HGET/HMGET value; a
-- missing field counts as 0. Only plain decimal integers of at most
-- MAX_COUNTER_CHARS characters pass: exact in a Lua number, and what HINCRBY
-- accepts ("1.0", "0x10" or "1e3" would make it fail mid-script).
local function parseCounter(raw, field)
  if not raw then return 0 end
  if not string.match(raw, "^%-?%d+$") or #raw > MAX_COUNTER_CHARS then
    return nil, "job field " .. field .. " is not an integer: " .. string.sub(raw, 1, 40)
  end
  return tonumber(raw)
end

-- Append `item` to the JSON list in `raw` and keep the last `keep` items;
-- returns the new JSON text. Never raises: a field that is not a list, or
-- that cjson cannot write back (1e999), starts a fresh list.
local function appendToJsonList(raw, item, keep)
  local ok, items = pcall(cjson.decode, raw or "[]")
  if not ok or type(items) ~= "table" then items = {} end
  items[#items + 1] = item
  while #items > keep do table.remove(items, 1) end
  local encoded, text = pcall(cjson.encode, items)
  if encoded then return text end
  return cjson.encode({item})
end

-- The job's attempt ceiling from its raw `opts`: opts.attempts, else the
-- caller's default (one default per script call); third, its opts.resultTtl
-- (ms a completed job is kept at most), or nil. Only a whole number from 1
-- to MAX_ATTEMPTS counts, the same rule as the Python side's (job.py), so
-- 1e999 or "3" fails the job instead of retrying it forever. Jobs of one kind
-- share their opts text, so each text is decoded once per call.
local maxAttemptsByOpts = {}
local function parseMaxAttempts(raw, defaultAttempts)
  if not raw or raw == "" then return defaultAttempts end
  local known = maxAttemptsByOpts[raw]
  if not known then
    local ok, opts = pcall(cjson.decode, raw)
    if not ok or type(opts) ~= "table" then
      known = {nil, "job field opts is not a JSON object"}
    else
      local attempts = opts["attempts"]
      -- resultTtl (ms a completed job is kept; Python's JobOptions): anything but a positive number is none.
      local ttl = type(opts["resultTtl"]) == "number" and opts["resultTtl"] >= 1 and math.floor(opts["resultTtl"])
      if attempts == nil then
        known = {defaultAttempts, nil, ttl}
      elseif type(attempts) ~= "number" or attempts ~= math.floor(attempts) or attempts < 1
          or attempts > MAX_ATTEMPTS then
        known = {nil, "job field opts has attempts that are not a whole number from 1 to " .. MAX_ATTEMPTS}
      else
        known = {attempts, nil, ttl}
      end
    end
    maxAttemptsByOpts[raw] = known
  end
  return known[1], known[2], known[3]
end

-- Put a job in `failed` for good, saying why. The caller has already taken
-- it out of the state it was in.
local function moveToFailed(prefix, failedKey, id, reason, now)
  redis.call("HSET", prefix .. id, "failedReason", reason, "finishedOn", now)
  redis.call("HDEL", prefix .. id, "tok")
  redis.call("ZADD", failedKey, now, id)
  emitEvent(prefix, "failed", id, "reason", reason)
end

-- Put an id whose job key holds another type than a hash in `failed`. Nothing
-- can be written to that key, so the reason goes to the event only.
local function failKeyOfWrongType(prefix, failedKey, id, now)
  local keyType = redis.call("TYPE", prefix .. id)["ok"]
  redis.call("ZADD", failedKey, now, id)
  emitEvent(prefix, "failed", id, "reason", "the job key holds a " .. keyType .. ", not a hash")
end
