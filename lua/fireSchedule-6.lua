--[[
  fireSchedule: decide one tick of one schedule, and when it fires, add its
  job, in one atomic step. Every scheduler (echomq_beat) that finds a tick
  due sends this call; the schedule's record (KEYS[1]) remembers the latest
  tick decided, so the first call decides and every other call for that
  tick, or an older one, changes nothing. However many schedulers run, a
  tick becomes at most one job.

  A tick is decided one of four ways (a schedule's first decided tick may also be "new"):
    fired    its job was added (id ARGV[4]: the schedule's name and the
             tick's time, so a job with that id already there also counts
             as this tick's job and is not added again)
    skipped  SKIP_IF_RUNNING, and the job of the tick fired before it has
             not finished (its hash exists without finishedOn)
    missed   the tick is more than ARGV[9] ms late, and the schedule does
             not catch up (ARGV[10] = 0)
    new      the same lateness, in a schedule with no tick decided before:
             a new schedule does not fire what fell before it existed

  A "run now" (ARGV[3] = "") adds the job under the id ARGV[4] the caller
  made up and records it as the schedule's latest job, leaving the ticks alone.

  A schedule that moved from another queue may find no record here, or an
  old one: ARGV[14] is the newest tick decided on the queues it was on
  before (its sender reads their records). A tick up to it is decided
  ("superseded"), and it counts as this record's latest tick when that is
  older or missing, so a moved schedule is not taken for a new one and
  still catches up.

  KEYS[1] schedule:<name> HASH   the schedule's record:
            tick      latest tick decided (ms), and outcome how (fired,
                      skipped, missed, new)
            job       id of the latest job it added, firedAt when (ms),
                      firedTick its tick ("" for a run now)
            fired, skipped, missed   how many ticks went each way
  KEYS[2] wait        LIST
  KEYS[3] paused      LIST
  KEYS[4] meta        HASH
  KEYS[5] marker      ZSET
  KEYS[6] prioritized ZSET

  ARGV[1] prefix            key prefix of the queue
  ARGV[2] now               ms
  ARGV[3] tick              the tick's time, ms ("" = run now)
  ARGV[4] job_id            the tick's job id
  ARGV[5] name              job name
  ARGV[6] data              JSON text
  ARGV[7] opts              JSON text
  ARGV[8] priority          MIN_PRIORITY..MAX_PRIORITY (0 = none)
  ARGV[9] missed_after_ms   how late a tick may be and still fire when it is not caught up, ms
  ARGV[10] catch_up         1 = fire the tick however late (it is the newest one due)
  ARGV[11] skip_if_running  1 = skip the tick while the previous job has not finished
  ARGV[12] deadline         ms by Redis's clock (TIME): a call that runs later (its
           sender's timeout, or the schedule's next tick, has passed) decides
           nothing and answers "expired"; with one, a tick more than EARLY_MS
           ahead of Redis's clock answers "early", and a record tick that far
           ahead (another host's clock, another client) does not hold a tick
           back. 0 = no deadline and no look at Redis's clock
  ARGV[13] group            the job's group ("" = none): it waits in its group's list
  ARGV[14] floor            the newest tick decided on another queue (0 = none; see above)
  ARGV[15] expires_ms       0, or ms after its firing past which the job never starts (`exp`, as addJob writes it)

  Returns {outcome, job id, decided}: decided is 1 when this call decided
  the tick, 0 when an earlier call had (a re-send, or another scheduler);
  the outcome and job id are then the record's. "expired" and "early"
  decide nothing. A key of another type than a hash under the tick's job
  id is an error, before anything is written.
]]
-- @include "emitEvent"
-- @include "pushReady"
-- @include "constants"

local prefix, now = ARGV[1], tonumber(ARGV[2])
-- EARLY_MS (constants): how far ahead of Redis's clock a tick or a record may be (hosts' clocks differ a little).

local function addJob(id)
  local jobKey = prefix .. id
  local priority, group = tonumber(ARGV[8]), groupOf(ARGV[13])
  redis.call("HSET", jobKey, "name", ARGV[5], "data", ARGV[6], "opts", ARGV[7],
    "timestamp", now, "atm", 0, "ats", 0, "stc", 0)
  if tonumber(ARGV[15]) > 0 then redis.call("HSET", jobKey, "exp", now + tonumber(ARGV[15])) end
  if group then
    redis.call("HSET", jobKey, "grp", group)
  elseif priority ~= 0 then
    redis.call("HSET", jobKey, "pri", priority)
  end
  emitEvent(prefix, "added", id)  -- (before a "failed" that pushReady may emit)
  pushReady(prefix, KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], id)
end

-- The tick's job id may already name a key: a job (this tick's, added before its record was
-- lost), or a key of another type, which no job can be added under.
local id = ARGV[4]
local kind = redis.call("TYPE", prefix .. id)["ok"]
if kind ~= "none" and kind ~= "hash" then
  return redis.error_reply("echomq the key of job " .. id .. " holds a " .. kind .. ", not a job")
end

if ARGV[3] == "" then
  if kind == "hash" then return {"fired", id, 0} end
  addJob(id)
  redis.call("HSET", KEYS[1], "job", id, "firedAt", now, "firedTick", "")
  return {"fired", id, 1}
end

local tick = tonumber(ARGV[3])
local last = redis.call("HMGET", KEYS[1], "tick", "outcome", "job", "firedTick", "fired", "skipped", "missed")
local lastTick = tonumber(last[1])
-- A counter another client made unreadable starts again from 0, before anything is written.
local function counted(raw)
  return (raw and string.match(raw, "^%d+$") and tonumber(raw) or 0) + 1
end

local deadline = tonumber(ARGV[12])
if deadline > 0 then
  local time = redis.call("TIME")
  local redisNow = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  -- Sent long ago (it waited in a frozen Redis or a stalled network), or the schedule's next
  -- tick is due by now: its sender sends that tick instead, so this call decides nothing.
  if redisNow > deadline then return {"expired", "", 0} end
  -- A tick ahead of Redis's clock comes from a host whose clock runs ahead: deciding it would
  -- hold back every other scheduler until then.
  if tick > redisNow + EARLY_MS then return {"early", "", 0} end
  -- A record tick ahead of Redis's clock was written by such a host, or by another client: it
  -- does not hold this tick back.
  if lastTick and not (lastTick <= redisNow + EARLY_MS) then lastTick = tick - 1 end
end

-- A tick decided on the queue the schedule left is decided here too; and the schedule is an old
-- one here (it catches up), not a new one.
local elsewhere = tonumber(ARGV[14])
if elsewhere > 0 and not (lastTick and lastTick >= elsewhere) then
  if tick <= elsewhere then return {"superseded", "", 0} end
  lastTick = elsewhere
end

if lastTick and lastTick >= tick then
  local outcome = lastTick == tick and last[2] or "superseded"
  return {outcome, last[4] == ARGV[3] and last[3] or "", 0}
end

if now - tick > tonumber(ARGV[9]) and (ARGV[10] ~= "1" or not lastTick) then
  if not lastTick then
    -- A schedule no call has decided a tick of starts here: what fell before is neither fired
    -- nor counted as missed.
    redis.call("HSET", KEYS[1], "tick", ARGV[3], "outcome", "new")
    return {"new", "", 1}
  end
  redis.call("HSET", KEYS[1], "tick", ARGV[3], "outcome", "missed", "missed", counted(last[7]))
  return {"missed", "", 1}
end
if ARGV[11] == "1" and last[3] then
  local previous = redis.pcall("HMGET", prefix .. last[3], "timestamp", "finishedOn")
  if type(previous) == "table" and previous[1] and not previous[2] then
    redis.call("HSET", KEYS[1], "tick", ARGV[3], "outcome", "skipped", "skipped", counted(last[6]))
    return {"skipped", "", 1}
  end
end
if kind == "none" then addJob(id) end
redis.call("HSET", KEYS[1], "tick", ARGV[3], "outcome", "fired", "job", id, "firedAt", now, "firedTick", ARGV[3],
  "fired", counted(last[5]))
return {"fired", id, 1}
