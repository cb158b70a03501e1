-- The submission rules of the sites the shipped profiles target, keyed by partition, so the
-- test cluster refuses at sbatch time what Gilbreth or Raven would refuse there (facts and
-- sources: tests/slurm/README.md). minicluster.sh copies this file to /etc/slurm/, where
-- JobSubmitPlugins=lua reads it. What SLURM refuses by itself (a 4-GPU node request on the
-- 2-GPU a100-80gb nodes, QOS normal on partition training, 20 minutes on gpudev) is left to
-- SLURM, so its own messages reach the user as they would at the site.

local GILBRETH = { ["a100-80gb"] = true, training = true }
local RAVEN = { general = true, gpudev = true }
local RAVEN_DEFAULT = "general"      -- slurm.conf: Default=YES
local RAVEN_GPUS_PER_NODE = 4

-- GPUs per node a job asks for: tres_per_node holds "gres:gpu:4" or "gres:gpu:a100:4"
-- (--gres / --gpus-per-node; 22.05 prefixes "gres:"), "gres:gpu" means 1. A job-wide --gpus
-- (tres_per_job) counts as a GPU job of unknown spread: -1.
local function gpus_per_node(job_desc)
  for item in string.gmatch(job_desc.tres_per_node or "", "[^,]+") do
    local fields = {}
    for f in string.gmatch(item, "[^:]+") do table.insert(fields, f) end
    if fields[1] == "gres" then table.remove(fields, 1) end
    if fields[1] == "gpu" then
      return tonumber(fields[#fields]) or 1
    end
  end
  if string.find(job_desc.tres_per_job or "", "gpu") then return -1 end
  return 0
end

local function refuse(message)
  slurm.log_user(message)
  return slurm.ERROR
end

-- Gilbreth: every job names its account, partition and QOS (sbatch -A mygroup -p a100-80gb
-- --qos=normal); which QOS a partition allows is slurm.conf's AllowQos.
local function gilbreth(job_desc, partition)
  if job_desc.account == nil then
    return refuse("Gilbreth: name the account to charge, e.g. sbatch -A mygroup -p " .. partition
                  .. " (your accounts: slist)")
  end
  if job_desc.qos == nil then
    local qos = partition == "training" and "--qos=training" or "--qos=normal or --qos=standby"
    return refuse("Gilbreth: name a QOS for partition " .. partition .. ": " .. qos)
  end
  if partition == "training" and job_desc.qos ~= "training" then
    return refuse("Gilbreth: partition training runs under --qos=training only (got --qos="
                  .. job_desc.qos .. ")")
  end
  return slurm.SUCCESS
end

-- Raven: GPU jobs ask for the GPU nodes by feature, and jobs of several nodes take whole nodes.
local function raven(job_desc)
  local gpus = gpus_per_node(job_desc)
  if gpus == 0 then return slurm.SUCCESS end
  if not string.find(job_desc.features or "", "gpu", 1, true) then
    return refuse('Raven: GPU jobs must request the GPU nodes with --constraint="gpu" '
                  .. "(and --gres=gpu:a100:N)")
  end
  local nodes = job_desc.min_nodes
  if nodes ~= nil and nodes ~= slurm.NO_VAL and nodes > 1 and gpus ~= RAVEN_GPUS_PER_NODE then
    return refuse("Raven: jobs on more than one node use whole nodes: request --gres=gpu:a100:"
                  .. RAVEN_GPUS_PER_NODE .. " (got " .. (job_desc.tres_per_node or "gpus per job")
                  .. " on " .. nodes .. " nodes)")
  end
  return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  local partition = job_desc.partition or RAVEN_DEFAULT
  if GILBRETH[partition] then return gilbreth(job_desc, partition) end
  if RAVEN[partition] then return raven(job_desc) end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
