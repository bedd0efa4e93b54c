-- Groups (protocol.md, "Groups"): a job with a group (hash field `grp`)
-- waits in its group's list, `<prefix>group:<name>` (LPUSH, taken from the
-- right), instead of `wait`. The ring, `<prefix>groups` (ZSET), holds each
-- group with a job ready to take, scored by its turn (meta `groupTurn`, one
-- more per turn given): moveToActive takes the group with the lowest score and
-- gives it the next turn, so groups take turns whatever their sizes. The
-- member GROUPS_PLAIN stands for the jobs without a group (wait and
-- prioritized), which take their turn like one more group. `group-active`
-- (HASH) counts each group's running jobs for GROUP_MAX_ACTIVE; a group at its
-- cap leaves the ring until one of its jobs leaves `active`; `group-running`
-- (HASH) names the group of each running job, so that its slot is given back
-- whatever became of its hash meanwhile. `group-waiting`
-- (ZSET) counts each group's waiting jobs, and meta `groupWaiting` all of
-- them, for the counts and the dashboard. The keys are built from the prefix:
-- a job's group is found inside its hash.
--
-- Another client's key of another type, or value, stops only what it belongs
-- to (a group's list: that group): these helpers never raise on one, and the
-- sweep's groupRepair puts right what it left behind once it is gone.
-- @include "names"
-- @include "jobFields"
-- @include "lockIndex"
local GROUPS_PLAIN = "*"  -- not a group name: names use the id alphabet

-- HINCRBY that cannot fail halfway through a script: a field another client
-- made no integer (or a key of another type) starts again from `by`.
local function groupCount(countKey, field, by)
  local value = redis.pcall("HINCRBY", countKey, field, by)
  if type(value) == "number" then return value end
  redis.pcall("HSET", countKey, field, by)
  return by
end

-- The group in a raw `grp` field, or nil when it has none (or one that could
-- not be a group's name, written by another client). The rule is keys.py's
-- (the include "names" is written from it), so both sides take the same names.
local function groupOf(raw)
  if type(raw) ~= "string" or #raw > MAX_NAME_LENGTH or not string.find(raw, NAME_PATTERN) then
    return nil
  end
  return raw
end

-- Put `group` in the ring at the end of the current round, unless it is there
-- (or the ring is another client's key of another type: groupRepair puts the
-- group back once it is gone).
local function groupEnterRing(prefix, metaKey, group)
  local ring = prefix .. "groups"
  if redis.pcall("ZSCORE", ring, group) == false then
    redis.call("ZADD", ring, groupCount(metaKey, "groupTurn", 1), group)
  end
end

-- A ready job of `group` joins its group's list (at the front with `front`);
-- whether it could. A list another client made another type cannot take it:
-- the job fails, saying why, rather than the script that made it ready
-- raising halfway (a fetch, a batch of finishes, a sweep: other jobs' too).
local function groupPush(prefix, metaKey, id, group, front)
  local listKey = prefix .. "group:" .. group
  if type(redis.pcall(front and "RPUSH" or "LPUSH", listKey, id)) ~= "number" then
    moveToFailed(prefix, prefix .. "failed", id, "its group's list " .. listKey .. " holds a " ..
      redis.call("TYPE", listKey)["ok"] .. ", not a list", redisNowMs())
    return false
  end
  redis.pcall("ZINCRBY", prefix .. "group-waiting", 1, group)
  groupCount(metaKey, "groupWaiting", 1)
  groupEnterRing(prefix, metaKey, group)
  return true
end

-- One waiting job fewer in `group` (taken, cancelled or removed).
local function groupWaitingLess(prefix, metaKey, group)
  local left = tonumber(redis.pcall("ZINCRBY", prefix .. "group-waiting", -1, group))
  if left and left <= 0 then
    redis.call("ZREM", prefix .. "group-waiting", group)
  end
  groupCount(metaKey, "groupWaiting", -1)
end

-- Take a waiting job out of its group's list (a cancel, a removal); whether it was there.
local function groupRemove(prefix, metaKey, id, group)
  local removed = redis.pcall("LREM", prefix .. "group:" .. group, 0, id)
  if type(removed) ~= "number" or removed == 0 then return false end
  groupWaitingLess(prefix, metaKey, group)
  return true
end

-- Whether `group-running` may hold a job, once this call has looked (nil: not
-- yet): on a queue without groups, a call that ends many jobs looks once.
local groupsRunning = nil

-- Job `id` of `group` starts: it counts against the group's cap until it
-- leaves `active`. Whether `group-running` took it (false: the key is another
-- client's of another type; groupRepair recounts the slot once it is gone).
local function groupStarted(prefix, id, group)
  groupsRunning = true
  groupCount(prefix .. "group-active", group, 1)
  return type(redis.pcall("HSET", prefix .. "group-running", id, group)) == "number"
end

-- Job `id` left `active` (any job: one without a group is not in `group-running`):
-- one running job fewer in its group, and the group back in the ring if it has
-- jobs waiting (it may have left the ring at its cap), with the marker set so
-- that a waiting worker takes the turn, whichever script freed the slot (a
-- finish, a sweep's recovery or failure, a removal). The marker's name is
-- built from the prefix, as keys.py's marker is.
local function groupRelease(prefix, metaKey, id)
  if groupsRunning == nil then groupsRunning = redis.call("EXISTS", prefix .. "group-running") == 1 end
  if not groupsRunning then return end
  local group = redis.pcall("HGET", prefix .. "group-running", id)
  if type(group) ~= "string" then return end
  redis.call("HDEL", prefix .. "group-running", id)
  local groupActiveKey = prefix .. "group-active"
  if groupCount(groupActiveKey, group, -1) <= 0 then
    redis.pcall("HDEL", groupActiveKey, group)
  end
  if redis.call("EXISTS", prefix .. "group:" .. group) == 1 then
    groupEnterRing(prefix, metaKey, group)
    redis.pcall("ZADD", prefix .. "marker", 0, "0")
  end
end

-- The sweep's repair of what another client's writes left wrong in the
-- bookkeeping (the scripts keep it exact otherwise; a key of another type
-- stops the sweep before this runs): each group's count in `group-active`
-- becomes what `group-running` holds of it, and a group with jobs in its list,
-- none running and no turn in the ring (it left at a cap its count held wrong,
-- or the ring was lost) takes a turn again. Returns a line for each repair.
local function groupRepair(prefix, metaKey, markerKey)
  local running, repairs = {}, {}
  for _, raw in ipairs(redis.call("HVALS", prefix .. "group-running")) do
    local group = groupOf(raw)
    if group then running[group] = (running[group] or 0) + 1 end
  end
  local countKey, counted = prefix .. "group-active", {}
  local stored = redis.call("HGETALL", countKey)
  for i = 1, #stored, 2 do counted[stored[i]] = stored[i + 1] end
  local recounted = {}
  local function repaired(group, was, count)
    recounted[group] = true
    repairs[#repairs + 1] = "group " .. string.sub(group, 1, 200) .. ": group-active counted " ..
      string.sub(was, 1, 40) .. " running, group-running names " .. count
  end
  for group, count in pairs(counted) do
    if not running[group] then
      redis.call("HDEL", countKey, group)
      repaired(group, count, 0)
    end
  end
  for group, count in pairs(running) do
    if counted[group] ~= tostring(count) then
      redis.call("HSET", countKey, group, count)
      repaired(group, counted[group] or 0, count)
    end
  end
  -- The groups with jobs waiting and no turn: those at their caps, and any the ring lost. Looked
  -- for when the ring is the shorter (a member whose list emptied since its turn may hide one
  -- until that turn comes: a sweep later, then).
  local waitingKey, ring, entered, missing = prefix .. "group-waiting", prefix .. "groups", false, {}
  if redis.call("ZCARD", ring) < redis.call("ZCARD", waitingKey) then
    missing = redis.call("ZDIFF", 2, waitingKey, ring)
  end
  for _, group in ipairs(missing) do
    local listed = not running[group] and groupOf(group) and redis.pcall("LLEN", prefix .. "group:" .. group)
    if type(listed) == "number" and listed > 0 then
      groupEnterRing(prefix, metaKey, group)
      entered = true
      if not recounted[group] then  -- (else it left the ring at the cap its count held wrong: said above)
        repairs[#repairs + 1] = "group " .. group .. " had " .. listed .. " job(s) waiting and no turn in the " ..
          "ring: it takes turns again"
      end
    end
  end
  if entered then redis.call("ZADD", markerKey, 0, "0") end
  return repairs
end
