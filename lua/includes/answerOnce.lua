-- A change an operator sends for many jobs at once (retryJob, removeJob,
-- cancelJob) goes a few hundred calls per round trip, all carrying one
-- record key, `change:<token>` (HASH: job id -> the code answered), new for
-- each round trip. A round trip whose replies were lost is sent again, call
-- for call: each call that finds its job's code in the record answers with it
-- and changes nothing, so a job is changed once and counted as the first
-- call found it. The record lapses record_ms after its latest call.
local function answeredBefore(recordKey, id)
  local code = redis.call("HGET", recordKey, id)
  return code and tonumber(code)
end

local function answerOnce(recordKey, id, code, recordMs)
  redis.call("HSET", recordKey, id, code)
  redis.call("PEXPIRE", recordKey, recordMs)
  return code
end
