-- The hash key of a job id found in one of the queue's sets or lists, or nil
-- when the id is one of the queue's own key names (core/keys.py's
-- RESERVED_IDS) or holds a character no id has (":", "{", "}"): another
-- client may have put anything there, and deleting the key named "wait" or
-- "meta" would destroy the queue, not a job.
local RESERVED_IDS = {
  ["wait"] = true, ["paused"] = true, ["active"] = true, ["stalled"] = true, ["failed"] = true,
  ["completed"] = true, ["delayed"] = true, ["prioritized"] = true, ["stalled-check"] = true, ["limiter"] = true,
  ["meta"] = true, ["marker"] = true, ["id"] = true, ["events"] = true, ["locks"] = true,
  ["schedule"] = true, ["groups"] = true, ["group-active"] = true, ["group-waiting"] = true, ["group-running"] = true,
}
local function jobKey(prefix, id)
  if RESERVED_IDS[id] or string.find(id, "[:{}]") then return nil end
  return prefix .. id
end
