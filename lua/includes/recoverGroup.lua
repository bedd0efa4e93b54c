-- @include "locklessRuns"

-- The sweep's recover step (moveStalledJobsToWait) for one group of ids read
-- from `active` (a group of the walk, at most 1,000 ids: every list built from
-- them is unpacked into one command; not a group of jobs).

-- Written over an id in `active` that this call recovers, then all removed in
-- one LREM, instead of one full-list LREM per job. No job id contains "{".
local TOMBSTONE = "{recovered}"

-- Whether each of `ids` (at least one) is marked in `stalledKey`: one SMISMEMBER.
local function markedFlags(stalledKey, ids)
  local flags = {}
  for i, flag in ipairs(redis.call("SMISMEMBER", stalledKey, unpack(ids))) do
    flags[i] = flag == 1
  end
  return flags
end

-- Take the entries at positions `goes` (ascending) of `ids`, the group read
-- from `activeKey` (of `length` entries) at index `first`, out of it.
local function cutFromActive(activeKey, ids, goes, first, length)
  if #goes == 0 then return end
  if first + #ids == length then
    -- The group is the tail of `active`: cut it off and put back the ids that
    -- stay, in their order; no per-id write.
    local stays, going = {}, {}
    for _, i in ipairs(goes) do going[i] = true end
    for i = 1, #ids do
      if not going[i] then stays[#stays + 1] = ids[i] end
    end
    if first == 0 then
      redis.call("DEL", activeKey)
    else
      redis.call("LTRIM", activeKey, 0, first - 1)
    end
    if #stays > 0 then redis.call("RPUSH", activeKey, unpack(stays)) end
  else
    for _, i in ipairs(goes) do redis.call("LSET", activeKey, first + i - 1, TOMBSTONE) end
    redis.call("LREM", activeKey, -#goes, TOMBSTONE)
  end
end

-- The recover step for the group `ids` read from `activeKey` (of `length`
-- entries) at index `first`: every marked, lockless job is recovered, every
-- marked job whose lock is back is unmarked. `recover(id)` is the caller's
-- recovery of one job (recoverJob, and what the caller counts), true when the
-- job is to be pushed to `readyKey` here. The recovered ids leave `activeKey`,
-- `stalledKey` and the lock index `locksKey`. Returns how many entries left
-- `activeKey`, and how many jobs were unmarked with their lock back.
local function recoverGroup(prefix, stalledKey, activeKey, locksKey, readyKey, ids, first, length, recover)
  local unmark, ready, done, left, unmarked = {}, {}, {}, {}, 0
  -- The marked ids of this group, and which of them are lockless.
  local isMarked, positions = markedFlags(stalledKey, ids), {}
  for i = 1, #ids do
    if isMarked[i] then
      unmark[#unmark + 1] = ids[i]
      positions[#positions + 1] = i
    end
  end
  local isLockless = {}
  if #unmark > 0 then
    forLockless(prefix, unmark, 1, #unmark, function(a, b)
      for j = a, b do isLockless[positions[j]] = true end
    end)
  end
  local goes = {}  -- positions in `ids` whose entry leaves `active`
  for i, id in ipairs(ids) do
    if done[id] then
      -- The same id twice in `active` (only another client can do that):
      -- the job was recovered once; its extra entry just goes.
      goes[#goes + 1] = i
    elseif isLockless[i] then
      done[id] = true
      left[#left + 1] = id
      goes[#goes + 1] = i
      if recover(id) then ready[#ready + 1] = id end
    elseif isMarked[i] then
      unmarked = unmarked + 1
    end
  end
  if #unmark > 0 then redis.call("SREM", stalledKey, unpack(unmark)) end
  if #left > 0 then redis.call("ZREM", locksKey, unpack(left)) end
  if #ready > 0 then redis.call("LPUSH", readyKey, unpack(ready)) end
  cutFromActive(activeKey, ids, goes, first, length)
  return #goes, unmarked
end
