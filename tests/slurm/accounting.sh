# Accounting for the throwaway cluster: a MariaDB of its own, slurmdbd on it, and the
# associations the sites' profiles submit under. Sourced by minicluster.sh (uses its STATE,
# ETC, MARK, fail and say). No systemd here either: both run in the foreground under setsid,
# their PIDs in $STATE/pids like the other daemons.

DB_PORT=6816          # not 3306: a MariaDB of the machine's own may be running
DBD_PORT=6819         # slurmdbd's default port
DB_PASS=ddpscale      # the database listens on 127.0.0.1 only and lives as long as the cluster
ACCOUNT=test_account

db() { mariadb --no-defaults -S "$STATE/run/mariadbd.sock" -u root "$@"; }

# A fresh database on every 'up': slurmctld -c restarts job IDs at 1, and job records of an
# earlier cluster under the same IDs would answer sacct for this one's jobs.
start_mariadb() {
  rm -rf "$STATE/mysql"
  mkdir -p "$STATE/mysql"; chown mysql:mysql "$STATE/mysql" "$STATE/run"
  mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql" --skip-test-db \
    --auth-root-authentication-method=socket >"$STATE/log/mariadb-install.out" 2>&1 ||
    fail "mariadb-install-db failed (log: $STATE/log/mariadb-install.out)"
  # mariadbd drops to user mysql itself, so $! is mariadbd. Durability is not wanted here:
  # no fsync per commit or doublewrite keeps slurmdbd's table creation to about a second.
  setsid mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" \
    --socket="$STATE/run/mariadbd.sock" --pid-file="$STATE/run/mariadbd.pid" \
    --port=$DB_PORT --bind-address=127.0.0.1 --skip-log-bin \
    --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-buffer-pool-size=64M \
    >"$STATE/log/mariadbd.out" 2>&1 </dev/null &
  echo $! > "$STATE/pids/mariadbd.pid"
  for _ in {1..100}; do db -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
  # root logs in by socket only (unix_socket); slurmdbd connects over TCP as its own user
  db -e "CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
         GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" 2>>"$STATE/log/mariadbd.out" ||
    fail "mariadbd did not start, or the slurm user could not be created"
}

write_dbd_config() {  # slurmdbd refuses a config others can read (it holds the password)
  install -m 0600 /dev/null "$ETC/slurmdbd.conf"
  cat > "$ETC/slurmdbd.conf" <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
}

# The lines slurm.conf needs to account through slurmdbd and to enforce associations, QOS
# and their limits, so a job under an unknown account or a QOS not granted is refused.
accounting_conf() {
  cat <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStorageEnforce=associations,limits,qos
# sacct -o Comment: the executor plugin names each job's rule and wildcards there
AccountingStoreFlags=job_comment
# GPUs in sacct's ReqTRES/AllocTRES, as sites that charge for GPUs record them
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
EOF
}

start_slurmdbd() {
  setsid slurmdbd -D >"$STATE/log/slurmdbd.out" 2>&1 </dev/null &
  local pid=$!; echo $pid > "$STATE/pids/slurmdbd.pid"
  # sacctmgr answers once slurmdbd has created its tables. (running, not alive: for a moment
  # after the fork the process is still called setsid.)
  for _ in {1..150}; do
    running $pid || fail "slurmdbd exited right after start"
    sacctmgr -n list cluster >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  fail "slurmdbd did not answer sacctmgr within 15 s"
}

# The cluster and who may submit: user root in account test_account (its default account,
# so a job naming none, as on Raven, is charged there), with the sites' QOS. A fresh slurmdbd
# knows only QOS normal.
add_associations() {
  sacctmgr -i >"$STATE/log/sacctmgr.out" 2>&1 <<EOF || fail "sacctmgr failed (log: $STATE/log/sacctmgr.out)"
add cluster ddpscale
add qos standby MaxWall=04:00:00
add qos training
add account $ACCOUNT Description="ddpscale tests" Organization=ddpscale
add user root Account=$ACCOUNT DefaultAccount=$ACCOUNT QOS=normal,standby,training DefaultQOS=normal
EOF
}
