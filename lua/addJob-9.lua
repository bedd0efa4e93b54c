--[[
  addJob: create one or more job hashes and make each job ready (wait or
  prioritized), paused or delayed. A producer adding many jobs sends them a
  few hundred per call, so the per-call costs (the pause check, the marker)
  are paid once per call rather than once per job.

  A call that generates ids or has a job with a dedupe key is idempotent per
  add token: its reply is recorded under the token (KEYS[8]) for ARGV[4] ms, longer than a client
  re-sends a call whose reply was lost, and a call that finds the record
  answers with it instead of adding the jobs a second time. (Caller-given
  ids need no record: an id that exists is never added again.) A call with
  ARGV[5] > 0 (an outbox's send, which may come twice, the second time after
  the job ended and was trimmed) also records each caller-given id it adds,
  with the call's timestamp (the row's enqueue time), as "<id>:<timestamp>" in
  `sent` until timestamp + sent_ms, and adds no job whose record is there: a
  second send of that row. (A later enqueue of the same id is another row, with
  its own timestamp: added again once the job is gone, as without a record.)
  Each such call removes as many lapsed records as twice its jobs, plus 100.

  KEYS[1] wait      LIST
  KEYS[2] paused    LIST
  KEYS[3] meta      HASH   (field `paused` present = queue paused)
  KEYS[4] id        STRING counter for generated ids
  KEYS[5] delayed   ZSET   score = due time (ms)
  KEYS[6] marker    ZSET   wakes blocked workers
  KEYS[7] prioritized ZSET ready jobs with a priority
  KEYS[8] add:<token> STRING: this call's reply, JSON, when it generated ids or deduplicated
  KEYS[9] sent      ZSET   "<id>:<timestamp>" of each job sent with a record, score = when it lapses (ms)

  ARGV[1] prefix     key prefix of the queue, e.g. "emq:{default}:"
  ARGV[2] timestamp  ms (the same for every job of the call)
  ARGV[3] token      add token: unique to this call (a re-send carries the same one)
  ARGV[4] record_ms  how long the record of a call that generated ids is kept, ms
  ARGV[5] sent_ms    0, or how long each job added is recorded in KEYS[9], ms
  then eleven values per job, ARGV[n+1] to ARGV[n+11] with n = 5, 16, 27, ...:
  ARGV[n+1] job_id    id chosen by the caller, or "" to generate one: "<queue>.<INCR KEYS[4]>"
  ARGV[n+2] name      the job's name
  ARGV[n+3] data      JSON text
  ARGV[n+4] opts      JSON text
  ARGV[n+5] delay_ms  0 = ready now
  ARGV[n+6] priority  MIN_PRIORITY..MAX_PRIORITY (0 = none; higher runs first)
  ARGV[n+7] group     "" = none: the job waits in its group's list (includes/groups.lua)
  ARGV[n+8] expires_ms  0, or ms after `timestamp` past which the job never starts (`exp`, moveToActive)
  ARGV[n+9] dedupe      "", or the job's dedupe key (includes/dedupe.lua): while `dedupe:<key>` names a
      live job (for "ttl", any job), this add adds nothing and answers with that job's id (added 0)
  ARGV[n+10] dedupe_mode  "" until the job ends, "ttl", "debounce" or "debounce-keep"
  ARGV[n+11] dedupe_ms  the throttle's TTL or the debounce window, ms (0 for "")

  Returns {id1, added1, id2, added2, ...} in the order given: added is 1 when
  the job was created, 0 when a job with the caller's id already existed
  (nothing is changed: adding is idempotent), or when the job's dedupe key
  named a job (its id is given instead; a debounce pushed its start back).
]]
-- @include "emitEvent"
-- @include "pushReady"
-- @include "dedupe"
-- @include "lockIndex"

local prefix, timestamp, sentMs = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[5])
local record = redis.call("GET", KEYS[8])
if record then return cjson.decode(record) end
local paused = redis.call("HEXISTS", KEYS[3], "paused") == 1
local readyKey = paused and KEYS[2] or KEYS[1]
local result, ready, wake = {}, {}, false

-- One LPUSH for a run of plain ready jobs (kept in the order they were given).
local function flushReady()
  if #ready > 0 then
    redis.call("LPUSH", readyKey, unpack(ready))
    ready = {}
  end
end

local generated, deduped = false, false
local completedKey, failedKey = prefix .. "completed", prefix .. "failed"
-- A generated id is "<queue>.<n>" (n from KEYS[4]): it names one job across queues, not one per queue.
local idBase = string.match(prefix, "{([^{}]*)}:$") .. "."
for i = 6, #ARGV, 11 do
  local id = ARGV[i]
  local added = 1
  -- A dedupe key held by a live job (by any job, for a throttle): this add adds nothing and answers with
  -- that job's id; a debounce pushes the waiting holder's start back instead (includes/dedupe.lua).
  local dedupe, mode, dedupeMs = ARGV[i + 8], ARGV[i + 9], tonumber(ARGV[i + 10])
  local holder
  if dedupe ~= "" then
    deduped = true  -- its outcome depends on the key's holder, which may have ended before a re-send: recorded
    if mode == "ttl" then
      holder = redis.call("GET", prefix .. "dedupe:" .. dedupe)
    else
      holder = dedupeHolder(prefix, dedupe, completedKey, failedKey)
    end
    if holder and mode ~= "" and mode ~= "ttl" then
      if redis.call("ZSCORE", KEYS[5], holder) then  -- still in its window: a window from now (Redis's clock)
        local jobHash, due = prefix .. holder, redisNowMs() + dedupeMs
        redis.call("ZADD", KEYS[5], due, holder)
        redis.call("HSET", jobHash, "due", due)
        if mode == "debounce" then redis.call("HSET", jobHash, "data", ARGV[i + 2]) end
        -- Its start moved to this add's window: so does its expiry, to this add's (none: it never expires).
        local expires = tonumber(ARGV[i + 7])
        if expires > 0 then
          local current = tonumber(redis.call("HGET", jobHash, "exp"))
          if current then redis.call("HSET", jobHash, "exp", math.max(current, timestamp + expires)) end
        else
          redis.call("HDEL", jobHash, "exp")
        end
        emitEvent(prefix, "debounced", holder, "due", due)
        wake = true
      else
        holder = nil  -- it started: this add is a new job, which takes the key
      end
    end
  end
  if holder then
    if id ~= "" then  -- a caller's id that names no job: where it went, for a day (Queue.deduplicated_to)
      redis.call("SET", prefix .. "dedupe-id:" .. id, holder, "PX", 86400000)
    end
    id, added = holder, 0
  elseif id == "" then
    generated = true
    -- Skip any number another client already used as a key: HSET on a key of
    -- another type would raise after this call's earlier jobs were written.
    repeat
      id = idBase .. redis.call("INCR", KEYS[4])
    until redis.call("EXISTS", prefix .. id) == 0
  elseif redis.call("EXISTS", prefix .. id) == 1
      or (sentMs > 0 and redis.call("ZSCORE", KEYS[9], id .. ":" .. ARGV[2])) then
    added = 0
  elseif sentMs > 0 then
    redis.call("ZADD", KEYS[9], timestamp + sentMs, id .. ":" .. ARGV[2])
  end
  if added == 1 then
    local delay, priority, group = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), groupOf(ARGV[i + 6])
    local jobKey = prefix .. id
    redis.call("HSET", jobKey, "name", ARGV[i + 1], "data", ARGV[i + 2], "opts", ARGV[i + 3],
      "timestamp", timestamp, "atm", 0, "ats", 0, "stc", 0)
    local expires = tonumber(ARGV[i + 7])
    if expires > 0 then redis.call("HSET", jobKey, "exp", timestamp + expires) end
    if dedupe ~= "" then
      if mode == "ttl" then
        redis.call("SET", prefix .. "dedupe:" .. dedupe, id, "PX", dedupeMs)
      else
        redis.call("SET", prefix .. "dedupe:" .. dedupe, id)
      end
      redis.call("HSET", jobKey, "ddk", dedupe, "ddm", mode)
    end
    if group then
      redis.call("HSET", jobKey, "grp", group)  -- read again whenever the job becomes ready
    elseif priority ~= 0 then
      redis.call("HSET", jobKey, "pri", priority)  -- read again whenever the job becomes ready
    end
    if delay > 0 then
      -- When the job becomes due: its wait (metrics) counts from then. A debounce's window is Redis's clock.
      local due = (mode == "debounce" or mode == "debounce-keep") and redisNowMs() + dedupeMs or timestamp + delay
      redis.call("HSET", jobKey, "due", due)
      redis.call("ZADD", KEYS[5], due, id)
      wake = true  -- a worker shortens its sleep to this job's due time
      emitEvent(prefix, "delayed", id, "due", due)
    else
      emitEvent(prefix, "added", id)  -- (before a "failed" that groupPush may emit)
      if group then
        groupPush(prefix, KEYS[3], id, group)
      elseif priority ~= 0 then
        redis.call("ZADD", KEYS[7], priorityScore(KEYS[3], priority), id)
      else
        ready[#ready + 1] = id
        if #ready == 1000 then flushReady() end
      end
      wake = wake or not paused
    end
  end
  result[#result + 1] = id
  result[#result + 1] = added
end
flushReady()
if sentMs > 0 then
  local lapsed = redis.call("ZRANGEBYSCORE", KEYS[9], "-inf", "(" .. timestamp, "LIMIT", 0, #result + 100)
  if #lapsed > 0 then redis.call("ZREM", KEYS[9], unpack(lapsed)) end
end
if generated or deduped then
  redis.call("SET", KEYS[8], cjson.encode(result), "PX", ARGV[4])
end

if wake then
  redis.call("ZADD", KEYS[6], 0, "0")
end
return result
