package testenv

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // "pgx"
)

// PostgresProcess is a PostgreSQL server of one test's own, with its data
// kept across Kill and Start (a crash and a restart: committed
// transactions survive, open ones are rolled back).
type PostgresProcess struct {
	URL string

	tb   testing.TB
	bin  string
	dir  string
	port int
	cred *syscall.Credential // the postgres user's, when we are root
	cmd  *exec.Cmd
}

// StartPostgres initialises and starts a private PostgreSQL on a free
// loopback port, stopped at tb's cleanup, or skips (fails under
// ONCEKIT_REQUIRE_SERVERS=1) when PostgreSQL is not installed.
func StartPostgres(tb testing.TB) *PostgresProcess {
	tb.Helper()
	skipShort(tb)
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		msg := "PostgreSQL not installed (make services-up installs it)"
		if Required() {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	p := &PostgresProcess{tb: tb, bin: filepath.Dir(bins[0]), port: freePort(tb)}
	// PostgreSQL refuses to run as root: as root, its files and process
	// belong to the postgres user, in a directory it can reach.
	dir, err := os.MkdirTemp("/var/tmp", "oncekit-pg-")
	if err != nil {
		tb.Fatal(err)
	}
	p.dir = dir
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if os.Getuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			tb.Fatalf("running as root needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
	}
	initdb := p.command(filepath.Join(p.bin, "initdb"), "-D", filepath.Join(dir, "data"), "--auth=trust", "-U", "postgres", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		tb.Fatalf("initdb: %v\n%s", err, out)
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	p.Start()
	tb.Cleanup(p.Kill)
	return p
}

func (p *PostgresProcess) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: p.cred}
	return cmd
}

// Start (re)starts the server on its data and waits until it answers.
func (p *PostgresProcess) Start() {
	p.tb.Helper()
	p.cmd = p.command(filepath.Join(p.bin, "postgres"), "-D", filepath.Join(p.dir, "data"), "-h", "127.0.0.1",
		"-p", strconv.Itoa(p.port), "-k", p.dir, "-c", "fsync=off")
	log, err := os.OpenFile(filepath.Join(p.dir, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.tb.Fatal(err)
	}
	defer log.Close()
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		p.tb.Fatalf("start postgres: %v", err)
	}
	db, err := sql.Open("pgx", p.URL)
	if err != nil {
		p.tb.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(p.dir, "postgres.log"))
			p.tb.Fatalf("postgres on port %d not ready: %v\n%s", p.port, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL, its backends with it, as a crash
// does; the data stays for the next Start.
//
// Every backend of PostgreSQL is a session leader of its own (setsid), so
// the postmaster's process group does not hold them: left alone, they exit
// when they notice the postmaster gone — under load, after a restart has
// already found their shared memory still attached and refused to start.
// So the postmaster is stopped first (it forks no more), its children are
// listed and killed with it, and Kill returns once they are all gone.
func (p *PostgresProcess) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGSTOP)
	kids := childrenOf(pid)
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	_ = p.cmd.Wait()
	p.cmd = nil
	for _, k := range kids {
		for deadline := time.Now().Add(10 * time.Second); alive(k) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Wait until the port is free.
	for range 100 {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), 100*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(20 * time.Millisecond)
	}
}

// MariaDBProcess is a MariaDB server of one test's own, with its data kept
// across Kill and Start.
type MariaDBProcess struct {
	URL string

	tb   testing.TB
	dir  string
	port int
	user string // the system user mariadbd drops to when we are root
	cmd  *exec.Cmd
}

// StartMariaDB initialises and starts a private MariaDB on a free loopback
// port, stopped at tb's cleanup, or skips (fails under
// ONCEKIT_REQUIRE_SERVERS=1) when MariaDB is not installed.
func StartMariaDB(tb testing.TB) *MariaDBProcess {
	tb.Helper()
	skipShort(tb)
	if _, err := exec.LookPath("mariadb-install-db"); err != nil {
		msg := "MariaDB not installed (make services-up installs it)"
		if Required() {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	p := &MariaDBProcess{tb: tb, port: freePort(tb)}
	dir, err := os.MkdirTemp("/var/tmp", "oncekit-mariadb-")
	if err != nil {
		tb.Fatal(err)
	}
	p.dir = dir
	tb.Cleanup(func() { os.RemoveAll(dir) })
	if os.Getuid() == 0 {
		u, err := user.Lookup("mysql")
		if err != nil {
			tb.Fatalf("running as root needs the mysql user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			tb.Fatal(err)
		}
		p.user = "mysql"
	}
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"), "--auth-root-authentication-method=normal", "--skip-test-db"}
	if p.user != "" {
		args = append(args, "--user="+p.user)
	}
	if out, err := exec.Command("mariadb-install-db", args...).CombinedOutput(); err != nil {
		tb.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	p.URL = fmt.Sprintf("mysql://root@127.0.0.1:%d/mysql", p.port)
	p.Start()
	tb.Cleanup(p.Kill)
	return p
}

// Start (re)starts the server on its data and waits until it answers.
func (p *MariaDBProcess) Start() {
	p.tb.Helper()
	args := []string{"--no-defaults", "--datadir=" + filepath.Join(p.dir, "data"), "--socket=" + filepath.Join(p.dir, "mysql.sock"),
		"--bind-address=127.0.0.1", "--port=" + strconv.Itoa(p.port), "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=2"}
	if p.user != "" {
		args = append(args, "--user="+p.user)
	}
	p.cmd = exec.Command("/usr/sbin/mariadbd", args...)
	log, err := os.OpenFile(filepath.Join(p.dir, "mariadb.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		p.tb.Fatal(err)
	}
	defer log.Close()
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		p.tb.Fatalf("start mariadbd: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)), 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(p.dir, "mariadb.log"))
			p.tb.Fatalf("mariadbd on port %d not ready: %v\n%s", p.port, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Kill stops the server with SIGKILL, as a crash does; the data stays.
func (p *MariaDBProcess) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}

// childrenOf lists the processes whose parent is pid (from /proc).
func childrenOf(pid int) []int {
	dirs, _ := os.ReadDir("/proc")
	var kids []int
	for _, d := range dirs {
		k, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if ppid, _, ok := procStat(k); ok && ppid == pid {
			kids = append(kids, k)
		}
	}
	return kids
}

// alive reports whether process pid still runs (a zombie has let go of
// its memory and does not count).
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	_, f, ok := readStat(strconv.Itoa(pid))
	if !ok || len(f) < 2 || f[0] == "" {
		return 0, 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, false
	}
	return ppid, f[0][0], true
}

// readStat reads /proc/<pid>/stat: the process's command name and the
// fields after it (state first, then ppid, …; utime and stime are
// fields[11] and fields[12]).
func readStat(pid string) (comm string, fields []string, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return "", nil, false
	}
	// "<pid> (<comm>) <state> <ppid> ...": comm may hold spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return "", nil, false
	}
	return string(b[open+1 : end]), strings.Fields(string(b[end+1:])), true
}

// ProcessesCPU is the CPU time (user and system) that the processes of
// this machine named one of names (their command name, as in
// /proc/<pid>/stat) have used so far; 0 where /proc cannot be read.
// Processes that ended between two readings are not counted, so it suits
// runs whose server processes stay (a pool's connections).
func ProcessesCPU(names ...string) time.Duration {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, d := range dirs {
		if c := d.Name()[0]; c < '0' || c > '9' {
			continue
		}
		comm, f, ok := readStat(d.Name())
		if !ok || len(f) < 13 || !slices.Contains(names, comm) {
			continue
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += u + s
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ: 100 on Linux
}
