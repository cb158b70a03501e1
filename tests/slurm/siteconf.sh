# slurm.conf and gres.conf of the throwaway cluster, and its site-like nodes. Sourced by
# minicluster.sh (uses its STATE, ETC, MARK, NODES, GPUS, CPUS, NETWORK, NET).
#
# Besides debug (n1..nN, what the test profile runs on), nodes and partitions shaped like the
# sites of the shipped profiles, so those profiles are accepted or refused as the site would
# (README.md here lists the facts). Their CPUs and memory are the site's, not this machine's:
# SlurmdParameters=config_overrides lets a slurmd declare them, select is CR_Core (cores are
# counted, never bound) and memory is checked, not consumed.

# name port gpus gpu-type cpus memory-MB features
SITE_NODES=(
  "g1 6951 2 a100 64 500000 -"     # Gilbreth a100-80gb: 2 x A100-80GB per node
  "g2 6952 2 a100 64 500000 -"
  "t1 6953 4 - 64 500000 -"        # Gilbreth training: 4 GPUs per node, NVLink
  "t2 6954 4 - 64 500000 -"
  "r1 6955 4 a100 72 500000 gpu"   # Raven GPU nodes: 4 x A100, 72 cores, ~500 GB
  "r2 6956 4 a100 72 500000 gpu"
)
SITE_PARTITIONS=(
  # Gilbreth: a partition per node type, every job names it and a QOS the partition allows
  "PartitionName=a100-80gb Nodes=g[1-2] AllowQos=normal,standby MaxTime=14-00:00:00 State=UP"
  "PartitionName=training Nodes=t[1-2] AllowQos=training MaxTime=3-00:00:00 State=UP"
  # Raven: jobs name no partition and land in the default; gpudev is 15 minutes at most
  "PartitionName=general Nodes=r[1-2] Default=YES MaxTime=24:00:00 State=UP"
  "PartitionName=gpudev Nodes=r[1-2] MaxTime=00:15:00 State=UP"
)

# The debug nodes: on the network (netns.sh), node K is hostname nK at $NET.K and the controller
# is reached at $NET.254; without it every node is localhost at 127.0.0.1.
controller_host() { if ((NETWORK)); then echo "localhost($NET.254)"; else echo localhost; fi; }
node_hostname() { if ((NETWORK)); then echo "n$1"; else echo localhost; fi; }
node_addr() { if ((NETWORK)); then echo "$NET.$1"; else echo 127.0.0.1; fi; }

site_node_names() { local n; for n in "${SITE_NODES[@]}"; do printf '%s ' "${n%% *}"; done; }

write_config() {
  local i mem files line name port gpus type cpus rmem feat
  mem=$(awk '/^MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
  mkdir -p "$ETC" "$STATE/dev"
  for ((i = 0; i < (GPUS > 4 ? GPUS : 4); i++)); do
    # gres/gpu insists on character devices; c 1 3 is the same device as /dev/null.
    [[ -c $STATE/dev/gpu$i ]] || mknod "$STATE/dev/gpu$i" c 1 3
  done
  files="$STATE/dev/gpu[0-$((GPUS - 1))]"
  if ((GPUS == 1)); then files=$STATE/dev/gpu0; fi
  {
    echo "$MARK"
    cat <<EOF
ClusterName=ddpscale
SlurmctldHost=$(controller_host)
SlurmUser=root
SlurmdUser=root
MailProg=/bin/true
# Several slurmd on one host, each started with -N name; node CPUs come from this file.
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
# Memory is checked against RealMemory but not consumed, so the fake nodes share the host.
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
# Jobs over their time limit die promptly (tests use a 1-minute limit to get TIMEOUT).
KillWait=2
OverTimeLimit=0
InactiveLimit=0
# SLURM's default, as a site that says nothing of it has: a batch job whose node fails is
# requeued unless submitted with --no-requeue, which the profiles ask for (slurm-no-requeue), so
# the job ends as NODE_FAIL and only Snakemake's retry trains on (test_slurm_accounting.py).
JobRequeue=1
# The sites' rules (job_submit.lua here) and partition limits refuse at submission, not later.
JobSubmitPlugins=lua
EnforcePartLimits=ALL
# Finished jobs stay visible to squeue/scontrol for 10 minutes (tests read their fields);
# their state for the executor plugin comes from accounting (sacct), as on the sites.
MinJobAge=600
EOF
    accounting_conf
    cat <<EOF
StateSaveLocation=$STATE/state
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdSpoolDir=$STATE/spool/%n
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmdLogFile=$STATE/log/slurmd-%n.log
EOF
    for ((i = 1; i <= NODES; i++)); do
      printf 'NodeName=n%d NodeHostname=%s NodeAddr=%s Port=%d CPUs=%d RealMemory=%d' \
        "$i" "$(node_hostname "$i")" "$(node_addr "$i")" $((6820 + i)) "$CPUS" "$mem"
      if ((GPUS)); then printf ' Gres=gpu:%d' "$GPUS"; fi
      echo
    done
    for line in "${SITE_NODES[@]}"; do
      read -r name port gpus type cpus rmem feat <<<"$line"
      printf 'NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=%d RealMemory=%d Gres=gpu:%s%d' \
        "$name" "$port" "$cpus" "$rmem" "$([[ $type == - ]] || echo "$type:")" "$gpus"
      if [[ $feat != - ]]; then printf ' Feature=%s' "$feat"; fi
      echo
    done
    echo "PartitionName=debug Nodes=n[1-$NODES] MaxTime=INFINITE State=UP"
    printf '%s\n' "${SITE_PARTITIONS[@]}"
  } > "$ETC/slurm.conf"
  {
    echo "$MARK"
    if ((GPUS)); then echo "NodeName=n[1-$NODES] Name=gpu File=$files"; fi
    for line in "${SITE_NODES[@]}"; do
      read -r name port gpus type cpus rmem feat <<<"$line"
      printf 'NodeName=%s Name=gpu%s File=%s/dev/gpu[0-%d]\n' \
        "$name" "$([[ $type == - ]] || echo " Type=$type")" "$STATE" $((gpus - 1))
    done
  } > "$ETC/gres.conf"
  { echo "-- ${MARK#\# }"; cat "$HERE/job_submit.lua"; } > "$ETC/job_submit.lua"
  write_dbd_config
  cp "$ETC/slurm.conf" "$ETC/gres.conf" "$STATE/"    # copies for the record
}
