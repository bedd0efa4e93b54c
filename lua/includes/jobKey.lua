-- The hash key of a job id found in one of the queue's sets or lists, or nil
-- when the id is one of the queue's own key names (core/protocol/keys.py's
-- RESERVED_IDS) or holds a character no id has (":", "{", "}"): another
-- client may have put anything there, and deleting the key named "wait" or
-- "meta" would destroy the queue, not a job.
-- @include "reservedIds"
local function jobKey(prefix, id)
  if RESERVED_IDS[id] or string.find(id, "[:{}]") then return nil end
  return prefix .. id
end

-- The keys that live and die with a job's hash: its log lines, its workflow
-- inputs, its durable steps and the signals sent to it (docs/durable.md).
local function jobCompanions(prefix, id)
  return prefix .. id .. ":logs", prefix .. id .. ":in", prefix .. id .. ":steps", prefix .. id .. ":signals"
end
