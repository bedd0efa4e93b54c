-- @include "groups"
-- @include "jobFields"
-- @include "brokenKeys"

-- moveToActive's turns by the ring (includes/groups.lua keeps the ring;
-- docs/protocol.md, "Groups", gives the order): while any group has a job
-- ready, the groups and the jobs without a group take turns, one job per turn,
-- the oldest turn first; a group with groupMax jobs running (0: no cap) sits
-- out until one ends. Call once per fetch, before it takes its first job: it
-- reads the ring `ringKey` (one of another type goes in the reply's `broken`,
-- and no group takes a turn), and gives the jobs without a group (in waitKey
-- or prioritizedKey) their turn when some are ready. `takeNext` is the fetch's
-- order for the jobs without a group: it moves the next of them to
-- `activeKey` and returns its id, or nil when none is ready.
-- Returns nil when the ring is not in use (the fetch takes by takeNext alone),
-- else takeByTurn(taken), `taken` being how many jobs the fetch took so far,
-- which returns the next id by turns, moved to `activeKey`, and its group
-- (nil for a job without one); nil when nothing is ready.
local function groupRing(prefix, ringKey, metaKey, waitKey, activeKey, prioritizedKey, groupMax, takeNext)
  local groupActiveKey = prefix .. "group-active"
  local ringType = redis.call("TYPE", ringKey)["ok"]
  local ringed = ringType == "zset"
  if ringType ~= "none" and not ringed then
    reportWrongType(ringKey, "sorted set", "no job of a group starts until it is deleted (and a sweep gives " ..
      "the groups their turns back)")
  end
  if not ringed then return nil end
  if not redis.call("ZSCORE", ringKey, GROUPS_PLAIN)
      and (redis.call("LLEN", waitKey) > 0 or redis.call("EXISTS", prioritizedKey) == 1) then
    groupEnterRing(prefix, metaKey, GROUPS_PLAIN)  -- jobs without a group take their turn too
  end

  -- Whether `group` is at its cap (a `group-active` of another type: every group is).
  local function atCap(group)
    if groupMax == 0 then return false end
    local raw = redis.pcall("HGET", groupActiveKey, group)
    if type(raw) == "table" then
      reportWrongType(groupActiveKey, "hash", "no job of a group starts until it is deleted (and a sweep " ..
        "gives the groups their turns back)")
      return true
    end
    local count = parseCounter(raw, "")
    if not count then
      reportBroken(groupActiveKey .. " counts " .. string.sub(raw, 1, 40) .. " running for group " .. group ..
        ", not a whole number: counted as 0")
    end
    return (count or 0) >= groupMax
  end

  -- A group whose list is broken sits out its turns: how many jobs this call had
  -- taken when it last did. Met again with none taken since, nothing else can give.
  local satOutAt = {}
  return function(taken)
    while true do
      local group = redis.call("ZRANGE", ringKey, 0, 0)[1]
      if not group then return takeNext(), nil end  -- the ring emptied during this call
      if satOutAt[group] == taken then return nil end
      local id
      if group == GROUPS_PLAIN then
        id = takeNext()
      elseif not atCap(group) then
        -- (at its cap the group leaves the ring; groupRelease brings it back)
        local listKey = prefix .. "group:" .. group
        id = redis.pcall("LMOVE", listKey, activeKey, "RIGHT", "LEFT")
        if type(id) == "table" then
          reportWrongType(listKey, "list", "the jobs of group " .. group .. " wait until it is deleted or a " ..
            "list again")
          satOutAt[group], id = taken, nil
          redis.call("ZADD", ringKey, "XX", groupCount(metaKey, "groupTurn", 1), group)
        elseif id then
          groupWaitingLess(prefix, metaKey, group)
        end
      end
      -- A group that gave a job takes the next turn (its jobs left or not: an empty
      -- list leaves at its next turn); one that could not give one leaves the ring.
      if id then
        redis.call("ZADD", ringKey, "XX", groupCount(metaKey, "groupTurn", 1), group)
        return id, group ~= GROUPS_PLAIN and group or nil
      elseif satOutAt[group] ~= taken then
        redis.call("ZREM", ringKey, group)
      end
    end
  end
end
