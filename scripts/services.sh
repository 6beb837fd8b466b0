#!/usr/bin/env bash
# Starts and stops the real servers oncekit's tests run against, on 127.0.0.1.
#
#   scripts/services.sh up       install what is missing (apt-get), start, wait until ready
#   scripts/services.sh down     stop exactly the processes this script started
#   scripts/services.sh status   show what is running
#   scripts/services.sh env      print the variables tests read (eval "$(scripts/services.sh env)")
#
# Ports and paths are overridable by environment:
#   ONCEKIT_REDIS_PORTS   space-separated, default "6379 6380 6381 6382 6383"
#   ONCEKIT_CLUSTER_PORTS three ports for a Redis Cluster, default "7000 7001 7002"
#   ONCEKIT_SENTINEL_PORTS a primary, two replicas and three sentinels watching
#                         them (master name "oncekit"), default
#                         "6390 6391 6392 26390 26391 26392"
#   ONCEKIT_ETCD_PORTS    etcd client and peer port, default "2379 2380"
#   ONCEKIT_KAFKA_PORT    the Kafka-protocol broker (cmd/kfake), default 9092
#   ONCEKIT_POSTGRES_PORT PostgreSQL, default 15432
#   ONCEKIT_MYSQL_PORT    MariaDB (the MySQL protocol), default 13306
#   ONCEKIT_PGBOUNCER_PORT pgbouncer in transaction pooling mode in front of
#                         that PostgreSQL, default 16432
#   ONCEKIT_ZK_PORTS      client ports of a three-member ZooKeeper ensemble,
#                         default "2181 2182 2183" (quorum and election ports:
#                         client port + 10000 and + 20000)
#   ONCEKIT_RUN_DIR       pid, log and data files, default /tmp/oncekit-services
#   ONCEKIT_DURABLE=1     run the servers at durable settings instead of the
#                         tests' fast ones: PostgreSQL with fsync, MariaDB
#                         flushing its log at each commit, the five Redis
#                         servers with appendonly yes and appendfsync everysec
#                         (make bench's headline figures)
set -euo pipefail

REDIS_PORTS=${ONCEKIT_REDIS_PORTS:-"6379 6380 6381 6382 6383"}
CLUSTER_PORTS=${ONCEKIT_CLUSTER_PORTS:-"7000 7001 7002"}
read -r SENTINEL_PRIMARY SENTINEL_R1 SENTINEL_R2 SENTINEL_S1 SENTINEL_S2 SENTINEL_S3 \
	<<<"${ONCEKIT_SENTINEL_PORTS:-6390 6391 6392 26390 26391 26392}"
read -r ETCD_PORT ETCD_PEER_PORT <<<"${ONCEKIT_ETCD_PORTS:-2379 2380}"
KAFKA_PORT=${ONCEKIT_KAFKA_PORT:-9092}
POSTGRES_PORT=${ONCEKIT_POSTGRES_PORT:-15432}
MYSQL_PORT=${ONCEKIT_MYSQL_PORT:-13306}
PGBOUNCER_PORT=${ONCEKIT_PGBOUNCER_PORT:-16432}
ZK_PORTS=${ONCEKIT_ZK_PORTS:-"2181 2182 2183"}
RUN_DIR=${ONCEKIT_RUN_DIR:-/tmp/oncekit-services}
# The durability settings (ONCEKIT_DURABLE): the tests' fast ones by default.
if [[ ${ONCEKIT_DURABLE:-} == 1 ]]; then
	REDIS_PERSIST=(--save '' --appendonly yes --appendfsync everysec)
	PG_FSYNC=on
	MY_FLUSH=1
else
	REDIS_PERSIST=(--save '' --appendonly no)
	PG_FSYNC=off
	MY_FLUSH=2
fi
# The SQL servers refuse to run as root: they run as their own system users,
# so their data lives outside any home directory.
SQL_DIR=${ONCEKIT_SQL_DIR:-/var/tmp/oncekit-sql}
READY_TIMEOUT=${ONCEKIT_READY_TIMEOUT:-20}

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: error: %s\n' "$*" >&2; exit 1; }

# alive PID: the process exists and is not a zombie (PID 1 here reaps late).
alive() {
	local pid=$1 state
	[[ -r /proc/$pid/stat ]] || return 1
	state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
	[[ $state != Z ]]
}

# port_busy PORT: something listens on 127.0.0.1:PORT.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# port_taken: the port stays busy for 5 s (a server stopped just before may
# take a moment to let go of it).
port_taken() {
	local _
	for _ in $(seq 50); do port_busy "$1" || return 1; sleep 0.1; done
	return 0
}

apt_updated=0
apt_install() {
	command -v apt-get >/dev/null || die "apt-get not found: install $* by hand"
	if [[ $apt_updated == 0 ]]; then
		log "apt-get update"
		DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null || die "apt-get update failed"
		apt_updated=1
	fi
	log "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
		|| die "apt-get install $* failed"
}

ensure_redis() {
	command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return
	apt_install redis-server redis-tools
}

# stop_pidfile FILE NAME: stop the process in FILE if it is ours and alive
# (a pid file outliving its process may name a pid reused by another
# program: only a redis-server or etcd is stopped).
stop_pidfile() {
	local file=$1 name=$2 pid
	[[ -f $file ]] || return 0
	pid=$(cat "$file" 2>/dev/null || true)
	rm -f "$file"
	[[ $pid =~ ^[0-9]+$ ]] || return 0
	alive "$pid" || return 0
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qE '(redis-server|etcd|kfake|postgres|mariadbd|QuorumPeerMain|pgbouncer)' || return 0
	kill -CONT "$pid" 2>/dev/null || true # a paused (SIGSTOP) test server
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 50); do alive "$pid" || { log "stopped $name (pid $pid)"; return 0; }; sleep 0.1; done
	kill -KILL "$pid" 2>/dev/null || true
	for _ in $(seq 30); do alive "$pid" || { log "killed $name (pid $pid)"; return 0; }; sleep 0.1; done
	die "$name (pid $pid) does not stop"
}

redis_up() {
	ensure_redis
	mkdir -p "$RUN_DIR/redis"
	local port
	for port in $REDIS_PORTS; do
		stop_pidfile "$RUN_DIR/redis/$port.pid" "stale redis-server :$port"
		if port_taken "$port"; then
			die "port $port is in use by a process this script did not start (set ONCEKIT_REDIS_PORTS to other ports)"
		fi
		redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
			"${REDIS_PERSIST[@]}" --appenddirname "appendonly-$port" --dir "$RUN_DIR/redis" \
			--pidfile "$RUN_DIR/redis/$port.pid" --logfile "$RUN_DIR/redis/$port.log" \
			|| die "redis-server on port $port did not start (see $RUN_DIR/redis/$port.log)"
	done
	local deadline=$((SECONDS + READY_TIMEOUT))
	for port in $REDIS_PORTS; do
		until [[ $(timeout 2 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; do
			((SECONDS < deadline)) || die "redis-server on port $port not ready after ${READY_TIMEOUT}s (see $RUN_DIR/redis/$port.log)"
			sleep 0.05
		done
	done
	log "redis-server ready on ports $REDIS_PORTS"
}

# A three-primary Redis Cluster, to test hash tags and sharded pub/sub.
cluster_up() {
	ensure_redis
	local dir="$RUN_DIR/cluster" port nodes=""
	mkdir -p "$dir"
	for port in $CLUSTER_PORTS; do
		stop_pidfile "$dir/$port.pid" "stale cluster redis-server :$port"
		rm -f "$dir/nodes-$port.conf"
		if port_taken "$port"; then
			die "port $port is in use by a process this script did not start (set ONCEKIT_CLUSTER_PORTS to other ports)"
		fi
		redis-server --port "$port" --bind 127.0.0.1 --daemonize yes \
			--save '' --appendonly no --dir "$dir" \
			--cluster-enabled yes --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 2000 \
			--pidfile "$dir/$port.pid" --logfile "$dir/$port.log" \
			|| die "cluster redis-server on port $port did not start (see $dir/$port.log)"
		nodes+=" 127.0.0.1:$port"
	done
	local deadline=$((SECONDS + READY_TIMEOUT))
	for port in $CLUSTER_PORTS; do
		until [[ $(timeout 2 redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null) == PONG ]]; do
			((SECONDS < deadline)) || die "cluster redis-server on port $port not ready (see $dir/$port.log)"
			sleep 0.05
		done
	done
	# shellcheck disable=SC2086
	timeout 30 redis-cli --cluster create $nodes --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 \
		|| die "redis-cli --cluster create failed (see $dir/create.log)"
	for port in $CLUSTER_PORTS; do
		until timeout 2 redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; do
			((SECONDS < deadline + 30)) || die "Redis Cluster not ok on port $port"
			sleep 0.1
		done
	done
	log "Redis Cluster ready on ports $CLUSTER_PORTS"
}

# A primary with two replicas and three sentinels (failover after 500 ms
# without an answer), as a replicated deployment runs; no persistence.
sentinel_up() {
	ensure_redis
	local dir="$RUN_DIR/sentinel" port
	mkdir -p "$dir"
	for port in $SENTINEL_PRIMARY $SENTINEL_R1 $SENTINEL_R2 $SENTINEL_S1 $SENTINEL_S2 $SENTINEL_S3; do
		stop_pidfile "$dir/$port.pid" "stale redis :$port"
		port_taken "$port" && die "port $port is in use by a process this script did not start (set ONCEKIT_SENTINEL_PORTS to other ports)"
	done
	for port in $SENTINEL_PRIMARY $SENTINEL_R1 $SENTINEL_R2; do
		local extra=()
		[[ $port != "$SENTINEL_PRIMARY" ]] && extra=(--replicaof 127.0.0.1 "$SENTINEL_PRIMARY")
		redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --save '' --appendonly no --dir "$dir" \
			--pidfile "$dir/$port.pid" --logfile "$dir/$port.log" "${extra[@]}" \
			|| die "redis-server on port $port did not start (see $dir/$port.log)"
	done
	for port in $SENTINEL_S1 $SENTINEL_S2 $SENTINEL_S3; do
		cat >"$dir/sentinel-$port.conf" <<-CFG
			port $port
			bind 127.0.0.1
			daemonize yes
			pidfile $dir/$port.pid
			logfile $dir/$port.log
			dir $dir
			sentinel monitor oncekit 127.0.0.1 $SENTINEL_PRIMARY 2
			sentinel down-after-milliseconds oncekit 500
			sentinel failover-timeout oncekit 2000
			sentinel parallel-syncs oncekit 1
		CFG
		redis-server "$dir/sentinel-$port.conf" --sentinel || die "sentinel on port $port did not start (see $dir/$port.log)"
	done
	local deadline=$((SECONDS + READY_TIMEOUT))
	for port in $SENTINEL_R1 $SENTINEL_R2; do
		until timeout 2 redis-cli -p "$port" info replication 2>/dev/null | grep -q 'master_link_status:up'; do
			((SECONDS < deadline)) || die "replica on port $port not in sync (see $dir/$port.log)"
			sleep 0.1
		done
	done
	for port in $SENTINEL_S1 $SENTINEL_S2 $SENTINEL_S3; do
		until timeout 2 redis-cli -p "$port" sentinel replicas oncekit 2>/dev/null | grep -c "^name$" | grep -q 2; do
			((SECONDS < deadline)) || die "sentinel on port $port does not see both replicas (see $dir/$port.log)"
			sleep 0.1
		done
	done
	log "Redis Sentinel ready: primary $SENTINEL_PRIMARY, replicas $SENTINEL_R1 $SENTINEL_R2, sentinels $SENTINEL_S1 $SENTINEL_S2 $SENTINEL_S3"
}

sentinel_down() {
	local port
	for port in $SENTINEL_S1 $SENTINEL_S2 $SENTINEL_S3 $SENTINEL_R1 $SENTINEL_R2 $SENTINEL_PRIMARY; do
		stop_pidfile "$RUN_DIR/sentinel/$port.pid" "sentinel-group redis :$port"
	done
}

cluster_down() {
	local port
	for port in $CLUSTER_PORTS; do
		stop_pidfile "$RUN_DIR/cluster/$port.pid" "cluster redis-server :$port"
	done
}

ensure_etcd() {
	command -v etcd >/dev/null && return
	apt_install etcd-server
}

# http_health PORT: etcd's /health on 127.0.0.1:PORT says true.
http_health() {
	timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && cat <&3" 2>/dev/null \
		| grep -q '"health":"true"'
}

# A single etcd node (Debian's etcd-server), fresh data each time.
etcd_up() {
	ensure_etcd
	local dir="$RUN_DIR/etcd"
	mkdir -p "$dir"
	stop_pidfile "$dir/etcd.pid" "stale etcd"
	for port in "$ETCD_PORT" "$ETCD_PEER_PORT"; do
		if port_taken "$port"; then
			die "port $port is in use by a process this script did not start (set ONCEKIT_ETCD_PORTS to other ports)"
		fi
	done
	rm -rf "$dir/data"
	nohup etcd --name oncekit --data-dir "$dir/data" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
		--initial-cluster "oncekit=http://127.0.0.1:$ETCD_PEER_PORT" \
		>"$dir/etcd.log" 2>&1 </dev/null &
	echo $! >"$dir/etcd.pid"
	local deadline=$((SECONDS + READY_TIMEOUT))
	until http_health "$ETCD_PORT"; do
		alive "$(cat "$dir/etcd.pid")" || die "etcd exited (see $dir/etcd.log)"
		((SECONDS < deadline)) || die "etcd on port $ETCD_PORT not ready after ${READY_TIMEOUT}s (see $dir/etcd.log)"
		sleep 0.1
	done
	log "etcd ready on port $ETCD_PORT"
}

# The Kafka-protocol broker: the project's cmd/kfake (franz-go's kfake),
# built from this module with the Go toolchain.
kafka_up() {
	local dir="$RUN_DIR/kafka" root
	root=$(cd "$(dirname "$0")/.." && pwd)
	mkdir -p "$dir"
	stop_pidfile "$dir/kfake.pid" "stale kfake"
	if port_taken "$KAFKA_PORT"; then
		die "port $KAFKA_PORT is in use by a process this script did not start (set ONCEKIT_KAFKA_PORT to another port)"
	fi
	command -v go >/dev/null || die "go not found: the Kafka broker is built from cmd/kfake"
	log "building cmd/kfake"
	(cd "$root/cmd/kfake" && GOWORK=off go build -o "$dir/kfake" .) || die "go build ./cmd/kfake failed"
	nohup "$dir/kfake" --port "$KAFKA_PORT" >"$dir/kfake.log" 2>&1 </dev/null &
	local pid=$!
	echo $pid >"$dir/kfake.pid"
	local deadline=$((SECONDS + READY_TIMEOUT))
	until port_busy "$KAFKA_PORT"; do
		alive "$pid" || die "kfake exited (see $dir/kfake.log)"
		((SECONDS < deadline)) || die "kfake on port $KAFKA_PORT not ready after ${READY_TIMEOUT}s (see $dir/kfake.log)"
		sleep 0.1
	done
	log "kafka broker (kfake) ready on port $KAFKA_PORT"
}

# as_user USER CMD...: run CMD as USER when we are root (the SQL servers
# refuse root), as ourselves otherwise.
as_user() {
	local user=$1
	shift
	if [[ $(id -u) == 0 ]]; then
		runuser -u "$user" -- "$@"
	else
		"$@"
	fi
}

# pg_bin: the directory of PostgreSQL's server binaries (Debian keeps them
# out of PATH).
pg_bin() {
	local d
	for d in /usr/lib/postgresql/*/bin; do
		[[ -x $d/initdb ]] && { echo "$d"; return; }
	done
	command -v initdb >/dev/null && { dirname "$(command -v initdb)"; return; }
	return 1
}

# A PostgreSQL instance of its own: initdb into a fresh directory, trust
# authentication on loopback only, no system service.
postgres_up() {
	local bin dir="$SQL_DIR/postgres" user=postgres
	bin=$(pg_bin) || { apt_install postgresql; bin=$(pg_bin) || die "PostgreSQL's initdb not found after install"; }
	[[ $(id -u) == 0 ]] || user=$(id -un)
	id "$user" >/dev/null 2>&1 || die "user $user not found (install postgresql)"
	stop_pidfile "$RUN_DIR/postgres.pid" "stale postgres"
	port_taken "$POSTGRES_PORT" && die "port $POSTGRES_PORT is in use by a process this script did not start (set ONCEKIT_POSTGRES_PORT to another port)"
	mkdir -p "$SQL_DIR" "$RUN_DIR"
	chmod 755 "$SQL_DIR"
	rm -rf "$dir"
	mkdir -p "$dir"
	[[ $(id -u) == 0 ]] && chown "$user" "$dir"
	as_user "$user" "$bin/initdb" -D "$dir/data" --auth=trust -U postgres -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
		|| die "initdb failed (see $dir/initdb.log)"
	as_user "$user" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t "$READY_TIMEOUT" \
		-o "-h 127.0.0.1 -p $POSTGRES_PORT -k $dir -c fsync=$PG_FSYNC -c max_connections=300 -c shared_preload_libraries=pg_stat_statements" start >/dev/null \
		|| die "postgres did not start (see $dir/postgres.log)"
	head -1 "$dir/data/postmaster.pid" >"$RUN_DIR/postgres.pid"
	log "postgres ready on port $POSTGRES_PORT"
}

# pgbouncer in transaction pooling mode in front of the PostgreSQL above:
# the set-up where session state (LISTEN, session advisory locks, named
# prepared statements) does not survive a transaction.
pgbouncer_up() {
	local dir="$SQL_DIR/pgbouncer" user=postgres
	[[ $(id -u) == 0 ]] || user=$(id -un)
	command -v pgbouncer >/dev/null || [[ -x /usr/sbin/pgbouncer ]] || apt_install pgbouncer
	stop_pidfile "$RUN_DIR/pgbouncer.pid" "stale pgbouncer"
	port_taken "$PGBOUNCER_PORT" && die "port $PGBOUNCER_PORT is in use by a process this script did not start (set ONCEKIT_PGBOUNCER_PORT to another port)"
	rm -rf "$dir"
	mkdir -p "$dir"
	echo '"postgres" ""' >"$dir/userlist.txt"
	cat >"$dir/pgbouncer.ini" <<-EOF
	[databases]
	postgres = host=127.0.0.1 port=$POSTGRES_PORT dbname=postgres
	[pgbouncer]
	listen_addr = 127.0.0.1
	listen_port = $PGBOUNCER_PORT
	unix_socket_dir =
	auth_type = trust
	auth_file = $dir/userlist.txt
	pool_mode = transaction
	max_client_conn = 2000
	default_pool_size = 40
	pidfile = $dir/pgbouncer.pid
	logfile = $dir/pgbouncer.log
	EOF
	[[ $(id -u) == 0 ]] && chown -R "$user" "$dir"
	as_user "$user" /usr/sbin/pgbouncer -d "$dir/pgbouncer.ini" >/dev/null 2>&1 \
		|| die "pgbouncer did not start (see $dir/pgbouncer.log)"
	for _ in $(seq 100); do port_busy "$PGBOUNCER_PORT" && break; sleep 0.1; done
	port_busy "$PGBOUNCER_PORT" || die "pgbouncer not listening on $PGBOUNCER_PORT (see $dir/pgbouncer.log)"
	cp "$dir/pgbouncer.pid" "$RUN_DIR/pgbouncer.pid"
	log "pgbouncer ready on port $PGBOUNCER_PORT (transaction pooling)"
}

pgbouncer_down() {
	stop_pidfile "$RUN_DIR/pgbouncer.pid" "pgbouncer"
}

postgres_down() {
	local bin dir="$SQL_DIR/postgres" user=postgres
	[[ $(id -u) == 0 ]] || user=$(id -un)
	# A fast shutdown: SIGTERM alone waits for every client to leave.
	if [[ -f $dir/data/postmaster.pid ]] && bin=$(pg_bin); then
		as_user "$user" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
	fi
	stop_pidfile "$RUN_DIR/postgres.pid" "postgres"
}

# A MariaDB instance of its own: mariadb-install-db into a fresh
# directory, a root user without password on loopback, no system service.
mysql_up() {
	local dir="$SQL_DIR/mysql" user=mysql
	command -v mariadbd >/dev/null || [[ -x /usr/sbin/mariadbd ]] || apt_install mariadb-server
	[[ $(id -u) == 0 ]] || user=$(id -un)
	stop_pidfile "$RUN_DIR/mysql.pid" "stale mariadbd"
	port_taken "$MYSQL_PORT" && die "port $MYSQL_PORT is in use by a process this script did not start (set ONCEKIT_MYSQL_PORT to another port)"
	mkdir -p "$SQL_DIR" "$RUN_DIR"
	chmod 755 "$SQL_DIR"
	rm -rf "$dir"
	mkdir -p "$dir"
	[[ $(id -u) == 0 ]] && chown "$user" "$dir"
	as_user "$user" mariadb-install-db --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
		--skip-test-db >"$dir/install.log" 2>&1 || die "mariadb-install-db failed (see $dir/install.log)"
	# As root, mariadbd drops to --user itself (the pid recorded is its own).
	/usr/sbin/mariadbd --no-defaults --user="$user" --datadir="$dir/data" --socket="$dir/mysql.sock" \
		--bind-address=127.0.0.1 --port="$MYSQL_PORT" --pid-file="$dir/mysql.pid" \
		--innodb-flush-log-at-trx-commit=$MY_FLUSH --max-connections=500 --skip-name-resolve \
		>"$dir/mysql.log" 2>&1 </dev/null &
	echo $! >"$RUN_DIR/mysql.pid"
	local deadline=$((SECONDS + READY_TIMEOUT))
	until mariadb --protocol=tcp -h 127.0.0.1 -P "$MYSQL_PORT" -u root -e 'CREATE DATABASE IF NOT EXISTS oncekit' >/dev/null 2>&1; do
		alive "$(cat "$RUN_DIR/mysql.pid")" || die "mariadbd exited (see $dir/mysql.log)"
		((SECONDS < deadline)) || die "mariadbd on port $MYSQL_PORT not ready after ${READY_TIMEOUT}s (see $dir/mysql.log)"
		sleep 0.1
	done
	log "mariadb ready on port $MYSQL_PORT"
}

# zk_cmd PORT WORD: a ZooKeeper four-letter command's answer.
zk_cmd() {
	timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf '%s' '$2' >&3 && cat <&3" 2>/dev/null
}

# A three-member ZooKeeper ensemble (Debian's zookeeper package), fresh
# data each time. tickTime 200 ms lets sessions be as short as 400 ms (the
# server allows 2 to 20 ticks); TTL nodes are enabled; no admin server.
zk_up() {
	local jar=/usr/share/java/zookeeper.jar i=0 port peers="" dir
	[[ -r $jar ]] || apt_install zookeeper
	command -v java >/dev/null || apt_install default-jre-headless
	for port in $ZK_PORTS; do
		i=$((i + 1))
		peers+="server.$i=127.0.0.1:$((port + 10000)):$((port + 20000))"$'\n'
	done
	i=0
	for port in $ZK_PORTS; do
		i=$((i + 1))
		dir="$RUN_DIR/zk/$i"
		stop_pidfile "$dir/zk.pid" "stale zookeeper $i"
		port_taken "$port" && die "port $port is in use by a process this script did not start (set ONCEKIT_ZK_PORTS to other ports)"
		rm -rf "$dir"
		mkdir -p "$dir/data"
		echo "$i" >"$dir/data/myid"
		cat >"$dir/zoo.cfg" <<-CFG
			tickTime=200
			initLimit=50
			syncLimit=10
			dataDir=$dir/data
			clientPortAddress=127.0.0.1
			clientPort=$port
			maxClientCnxns=0
			admin.enableServer=false
			4lw.commands.whitelist=ruok,srvr,mntr,stat
			reconfigEnabled=false
			standaloneEnabled=false
			${peers}
		CFG
		cat >"$dir/log4j.properties" <<-CFG
			log4j.rootLogger=WARN, F
			log4j.appender.F=org.apache.log4j.FileAppender
			log4j.appender.F.File=$dir/zk.log
			log4j.appender.F.layout=org.apache.log4j.PatternLayout
			log4j.appender.F.layout.ConversionPattern=%d %p %c{1}: %m%n
		CFG
		# ZooKeeper logs through SLF4J, which logs nothing without a
		# binding: Debian's log4j one, when installed, writes zk.log.
		local cp="$dir:$jar"
		if [ -f /usr/share/java/slf4j-log4j12.jar ] && [ -f /usr/share/java/log4j-1.2.jar ]; then
			cp="$cp:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
		fi
		# TTL nodes, and containers and TTL nodes reaped every second.
		nohup java -Xmx256m -Dzookeeper.extendedTypesEnabled=true -Dznode.container.checkIntervalMs=1000 \
			-Dlog4j.configuration="file:$dir/log4j.properties" -Dzookeeper.log.dir="$dir" \
			-cp "$cp" \
			org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" >"$dir/stdout.log" 2>&1 </dev/null &
		echo $! >"$dir/zk.pid"
	done
	local deadline=$((SECONDS + READY_TIMEOUT * 2))
	i=0
	for port in $ZK_PORTS; do
		i=$((i + 1))
		until zk_cmd "$port" srvr | grep -q '^Mode: \(leader\|follower\)'; do
			alive "$(cat "$RUN_DIR/zk/$i/zk.pid")" || die "zookeeper $i exited (see $RUN_DIR/zk/$i/stdout.log)"
			((SECONDS < deadline)) || die "zookeeper on port $port not serving after $((READY_TIMEOUT * 2))s (see $RUN_DIR/zk/$i/)"
			sleep 0.2
		done
	done
	log "zookeeper ensemble ready on ports $ZK_PORTS"
}

zk_down() {
	local i=0 port
	for port in $ZK_PORTS; do
		i=$((i + 1))
		stop_pidfile "$RUN_DIR/zk/$i/zk.pid" "zookeeper $i"
	done
}

mysql_down() {
	stop_pidfile "$RUN_DIR/mysql.pid" "mariadbd"
}

kafka_down() {
	stop_pidfile "$RUN_DIR/kafka/kfake.pid" "kfake"
}

etcd_down() {
	stop_pidfile "$RUN_DIR/etcd/etcd.pid" "etcd"
}

redis_down() {
	local port
	for port in $REDIS_PORTS; do
		stop_pidfile "$RUN_DIR/redis/$port.pid" "redis-server :$port"
	done
}

print_env() {
	local addrs="" port
	for port in $REDIS_PORTS; do addrs+="${addrs:+,}127.0.0.1:$port"; done
	echo "export REDIS_ADDRS=$addrs"
	addrs=""
	for port in $CLUSTER_PORTS; do addrs+="${addrs:+,}127.0.0.1:$port"; done
	echo "export REDIS_CLUSTER_ADDRS=$addrs"
	echo "export REDIS_SENTINEL_ADDRS=127.0.0.1:$SENTINEL_S1,127.0.0.1:$SENTINEL_S2,127.0.0.1:$SENTINEL_S3"
	echo "export REDIS_SENTINEL_MASTER=oncekit"
	echo "export ETCD_ENDPOINTS=127.0.0.1:$ETCD_PORT"
	echo "export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT"
	echo "export POSTGRES_URL=postgres://postgres@127.0.0.1:$POSTGRES_PORT/postgres?sslmode=disable"
	echo "export MYSQL_URL=mysql://root@127.0.0.1:$MYSQL_PORT/oncekit"
	echo "export PGBOUNCER_URL=postgres://postgres@127.0.0.1:$PGBOUNCER_PORT/postgres?sslmode=disable"
	addrs=""
	for port in $ZK_PORTS; do addrs+="${addrs:+,}127.0.0.1:$port"; done
	echo "export ZOOKEEPER_ADDRS=$addrs"
	echo "export ONCEKIT_RUN_DIR=$RUN_DIR"
}

status() {
	local port pid
	for port in $REDIS_PORTS; do
		pid=$(cat "$RUN_DIR/redis/$port.pid" 2>/dev/null || true)
		if [[ -n $pid ]] && alive "$pid"; then echo "redis-server :$port running (pid $pid)"
		else echo "redis-server :$port stopped"; fi
	done
	for port in $CLUSTER_PORTS; do
		pid=$(cat "$RUN_DIR/cluster/$port.pid" 2>/dev/null || true)
		if [[ -n $pid ]] && alive "$pid"; then echo "cluster redis-server :$port running (pid $pid)"
		else echo "cluster redis-server :$port stopped"; fi
	done
	pid=$(cat "$RUN_DIR/etcd/etcd.pid" 2>/dev/null || true)
	if [[ -n $pid ]] && alive "$pid"; then echo "etcd :$ETCD_PORT running (pid $pid)"
	else echo "etcd :$ETCD_PORT stopped"; fi
	for pg in postgres:$POSTGRES_PORT mysql:$MYSQL_PORT; do
		pid=$(cat "$RUN_DIR/${pg%%:*}.pid" 2>/dev/null || true)
		if [[ -n $pid ]] && alive "$pid"; then echo "${pg%%:*} :${pg#*:} running (pid $pid)"
		else echo "${pg%%:*} :${pg#*:} stopped"; fi
	done
	pid=$(cat "$RUN_DIR/pgbouncer.pid" 2>/dev/null || true)
	if [[ -n $pid ]] && alive "$pid"; then echo "pgbouncer :$PGBOUNCER_PORT running (pid $pid)"
	else echo "pgbouncer :$PGBOUNCER_PORT stopped"; fi
	pid=$(cat "$RUN_DIR/kafka/kfake.pid" 2>/dev/null || true)
	if [[ -n $pid ]] && alive "$pid"; then echo "kfake :$KAFKA_PORT running (pid $pid)"
	else echo "kfake :$KAFKA_PORT stopped"; fi
	local i=0
	for port in $ZK_PORTS; do
		i=$((i + 1))
		pid=$(cat "$RUN_DIR/zk/$i/zk.pid" 2>/dev/null || true)
		if [[ -n $pid ]] && alive "$pid"; then echo "zookeeper :$port running (pid $pid)"
		else echo "zookeeper :$port stopped"; fi
	done
}

case ${1:-} in
up) redis_up; cluster_up; sentinel_up; etcd_up; kafka_up; postgres_up; pgbouncer_up; mysql_up; zk_up ;;
down) zk_down; mysql_down; pgbouncer_down; postgres_down; kafka_down; etcd_down; sentinel_down; cluster_down; redis_down ;;
status) status ;;
env) print_env ;;
*) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
