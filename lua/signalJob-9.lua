--[[
  signalJob: send a job a named signal with a JSON payload (docs/durable.md).
  A job parked waiting for this signal is back in wait in the same step; any
  other job keeps the signal until it reaches the wait. Each name is sent once:
  a second signal of the name is refused, and so is one whose wait is over (it
  timed out, or took a signal already). A re-send of one call (same call id,
  after a lost reply) answers as the first did.

  KEYS[1] <id>          HASH  the job
  KEYS[2] <id>:steps    HASH  its durable steps (recordStep)
  KEYS[3] <id>:signals  HASH  "p:<name>" -> payload, "c:<name>" -> the call id that sent it
  KEYS[4] parked        ZSET  (includes/parked.lua)
  KEYS[5] wait          LIST
  KEYS[6] paused        LIST
  KEYS[7] meta          HASH
  KEYS[8] marker        ZSET
  KEYS[9] prioritized   ZSET

  ARGV[1] prefix       key prefix of the queue
  ARGV[2] job_id
  ARGV[3] name         the signal's name
  ARGV[4] payload      JSON
  ARGV[5] call_id      this call's id
  ARGV[6] max_signals  signals a job may keep at most

  Returns
     2 delivered: the job was parked for it and is back in wait
     1 kept: the job takes it when it reaches its wait
     0 refused: a signal of this name was sent before
    -1 no such job
    -3 the job has finished (completed, or failed for good)
    -4 refused: the job's wait for this signal is over (timed out)
    -5 refused: the job keeps max_signals signals already (not for a signal it waits for)
]]
-- @include "parked"

local jobKey, stepsKey, signalsKey = KEYS[1], KEYS[2], KEYS[3]
local prefix, id, name, payload, callId = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local fields = redis.pcall("HMGET", jobKey, "finishedOn", "park", "timestamp")
if fields["err"] or not (fields[1] or fields[2] or fields[3]) and redis.call("EXISTS", jobKey) == 0 then
  return -1
end
local sent = redis.call("HMGET", signalsKey, "p:" .. name, "c:" .. name)
if sent[1] then
  if sent[2] == callId then return 1 end  -- a re-send of the call that sent it
  return 0
end
if fields[1] then return -3 end  -- `finishedOn`: completed, or failed for good (a retry clears it)
local step = redis.call("HGET", stepsKey, name)
if step and string.sub(step, 1, 14) ~= '{"s":"waiting"' then return -4 end
-- (A signal the job already waits for is never refused for the limit: a fan-out's hand-off is one.)
if not step and redis.call("HLEN", signalsKey) >= 2 * tonumber(ARGV[6]) then return -5 end

redis.call("HSET", signalsKey, "p:" .. name, payload, "c:" .. name, callId)
emitEvent(prefix, "signal", id, "name", name)
if fields[2] == name and redis.call("ZSCORE", KEYS[4], id) then
  unparkJob(prefix, KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], id, "signal")
  return 2
end
return 1
