--[[
  addWorkflow: add the jobs of one workflow that live in this queue, in one
  step (docs/workflows.md). A job with inputs to wait for (`deps` > 0) goes to
  `deferred`; the others are ready at once (wait, prioritized, their group's
  list, paused) or delayed. The queue that holds the workflow's record (its
  home) creates it in the same call. A workflow's ids are the caller's, so a
  job that exists is not added again, and the call's reply is recorded under
  its token for record_ms: a re-sent call adds nothing twice. A job id that
  is another job's (a caller's id, Celery's task_id, used before) refuses the
  whole call before anything is written: its step would never end, and what
  waits for it would wait for good.

  KEYS[1] wait        LIST
  KEYS[2] paused      LIST
  KEYS[3] meta        HASH
  KEYS[4] delayed     ZSET
  KEYS[5] marker      ZSET
  KEYS[6] prioritized ZSET
  KEYS[7] deferred    ZSET   jobs waiting for their inputs, score = when added (ms)
  KEYS[8] add:<token> STRING this call's reply

  ARGV[1] prefix       key prefix of the queue
  ARGV[2] timestamp    ms
  ARGV[3] token        add token: unique to this call (a re-send carries the same one)
  ARGV[4] record_ms    how long the reply is recorded, ms
  ARGV[5] workflow_id  the workflow's id
  ARGV[6] home         the queue that holds the workflow's record
  ARGV[7] ends         "" when this call does not make the record, else how many results the workflow's has
  ARGV[8] ttl_ms       how long the record is kept once the workflow ended
  ARGV[9] jobs         how many jobs the workflow has
  ARGV[10] tree        JSON: the workflow's shape, for pages
  ARGV[11] queues      JSON: the names of the workflow's queues (its steps are found from them
                       and its job ids when the tree cannot be read)
  then eleven values per job, ARGV[n+1] to ARGV[n+11] with n = 11, 22, 33, ...:
  ARGV[n+1] job_id          the job's id
  ARGV[n+2] name            the job's name
  ARGV[n+3] data            JSON text
  ARGV[n+4] opts            JSON text
  ARGV[n+5] delay_ms        0 = ready now (a deferred job's delay counts from its release)
  ARGV[n+6] priority        MIN_PRIORITY..MAX_PRIORITY (0 = none)
  ARGV[n+7] group           "" = none
  ARGV[n+8] deps            inputs to wait for: 0 = ready now
  ARGV[n+9] next_steps      JSON: where its end goes (includes/workflow.lua's edges)
  ARGV[n+10] inputs         "" none, "1" its inputs come first in its arguments, "2" an error handler's
  ARGV[n+11] allow_failure  "1": its failure counts as done

  Returns the number of jobs added.
]]
-- @include "emitEvent"
-- @include "pushReady"

local prefix, timestamp = ARGV[1], tonumber(ARGV[2])
local record = redis.call("GET", KEYS[8])
if record then return tonumber(record) end

local workflowId, home = ARGV[5], ARGV[6]
-- Checked before the first write (a script that errors halfway keeps its earlier writes): each job is new,
-- or already this workflow's (a re-send).
local fresh = {}
for i = 12, #ARGV, 11 do
  -- (one read: a job's hash always has a name; another type of key answers an error)
  local fields = redis.pcall("HMGET", prefix .. ARGV[i], "wf", "name")
  local owner = fields["err"] and "" or fields[1] or (fields[2] and "")
  if owner and owner ~= workflowId then
    return redis.error_reply("TAKEN job id " .. ARGV[i] .. " is another job's")
  end
  if not owner then fresh[#fresh + 1] = i end
end
if ARGV[7] ~= "" and redis.call("EXISTS", prefix .. "wf:" .. workflowId) == 0 then
  local recordKey = prefix .. "wf:" .. workflowId
  redis.call("HSET", recordKey, "status", "waiting", "deps", ARGV[7], "ttl", ARGV[8], "created", timestamp,
    "jobs", ARGV[9], "tree", ARGV[10], "queues", ARGV[11])
end
local added = 0
for _, i in ipairs(fresh) do
  local id = ARGV[i]
  local jobKey = prefix .. id
  added = added + 1
  local delay, priority, group, deps = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), ARGV[i + 6],
    tonumber(ARGV[i + 7])
  redis.call("HSET", jobKey, "name", ARGV[i + 1], "data", ARGV[i + 2], "opts", ARGV[i + 3],
    "timestamp", timestamp, "atm", 0, "ats", 0, "stc", 0, "wf", workflowId, "wfq", home, "nxt", ARGV[i + 8])
  if ARGV[i + 9] ~= "" then redis.call("HSET", jobKey, "inp", ARGV[i + 9]) end
  if ARGV[i + 10] == "1" then redis.call("HSET", jobKey, "af", "1") end
  if group ~= "" then redis.call("HSET", jobKey, "grp", group) end
  if priority ~= 0 and group == "" then redis.call("HSET", jobKey, "pri", priority) end
  if deps > 0 then
    redis.call("HSET", jobKey, "deps", deps)
    if delay > 0 then redis.call("HSET", jobKey, "dly", delay) end
    redis.call("ZADD", KEYS[7], timestamp, id)
  elseif delay > 0 then
    redis.call("HSET", jobKey, "due", timestamp + delay)
    redis.call("ZADD", KEYS[4], timestamp + delay, id)
    redis.call("ZADD", KEYS[5], 0, "0")
    emitEvent(prefix, "delayed", id, "due", timestamp + delay)
  else
    emitEvent(prefix, "added", id)
    pushReady(prefix, KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[6], id)
  end
end
redis.call("SET", KEYS[8], added, "PX", ARGV[4])
return added
