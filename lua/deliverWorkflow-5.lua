--[[
  deliverWorkflow: deliver ends of workflow members that another queue handed
  off (includes/workflow.lua): each to its target in this queue, as the
  script that ended the member would have had the target been in its queue.
  Delivering one twice changes nothing the second time.

  KEYS[1] wait        LIST
  KEYS[2] paused      LIST
  KEYS[3] meta        HASH
  KEYS[4] prioritized ZSET
  KEYS[5] failed      ZSET

  ARGV[1] prefix  key prefix of the queue
  ARGV[2] now     ms
  then six values per end, ARGV[n+1] to ARGV[n+6] with n = 2, 8, 14, ...:
  ARGV[n+1] target  a job of this queue, or "wf:<workflow>" (the workflow's record)
  ARGV[n+2] slot    which input of the target; for "c" the member's edges (JSON), for "f" a page's number
  ARGV[n+3] kind    "r" (an input), "e" or "d" (to an error handler); "c" or "f": the rest of a
                    member's end in this queue, handed on by a call past its budget
                    (includes/workflow.lua), its target the member
  ARGV[n+4] passed  "1" the member succeeded (or may fail), "0" it failed
  ARGV[n+5] value   its result (JSON), or why it failed
  ARGV[n+6] origin  the member whose end it is

  Returns the number of ends delivered.
]]
-- @include "workflow"

workflowKeys(ARGV[1], KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], tonumber(ARGV[2]))
local ended = {}
for i = 3, #ARGV, 6 do
  local kind = ARGV[i + 2]
  if kind == "c" or kind == "f" then
    deliverLater(ARGV[i], ARGV[i + 1], kind, ARGV[i + 3] == "1", ARGV[i + 4], ARGV[i + 5], ended)
  else
    wfBudget = wfBudget - 1
    deliverEdge(ARGV[i], ARGV[i + 1], kind, ARGV[i + 3] == "1", ARGV[i + 4], ARGV[i + 5], ended)
  end
end
followEnded(ended)
return (#ARGV - 2) / 6
