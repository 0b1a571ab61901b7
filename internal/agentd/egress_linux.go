//go:build linux

package agentd

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// egressPlace is where a session's first process starts: inside its
// network namespace (netns >= 0), or bound by Landlock to connect over TCP
// only to connectPort.
type egressPlace struct {
	netns       int
	connectPort int
}

// run runs fn (a fork) on a thread of its own that first entered the
// place; the thread ends with fn, so nothing else runs in the place. A
// fork copies only the calling thread, so the child starts there too.
func (p *egressPlace) run(fn func() error) error {
	if p == nil {
		return fn()
	}
	_, err := onThread(p.netns, func() (struct{}, error) {
		if p.connectPort > 0 {
			if err := landlockConnectOnly(p.connectPort); err != nil {
				return struct{}{}, err
			}
		}
		return struct{}{}, fn()
	})
	return err
}

func (p *egressPlace) close() {
	if p != nil && p.netns >= 0 {
		unix.Close(p.netns)
		p.netns = -1
	}
}

// openNetns makes a session's namespace and the proxy's and resolver's
// sockets in it.
func openNetns() (*netnsSlot, error) {
	fd, err := newSessionNetns()
	if err != nil {
		return nil, err
	}
	place := &egressPlace{netns: fd}
	proxy, dnsTCP, dnsUDP, err := listenInNetns(fd)
	if err != nil {
		place.close()
		return nil, err
	}
	return &netnsSlot{place: place, proxy: proxy, dnsTCP: dnsTCP, dnsUDP: dnsUDP}, nil
}

// detectEgress finds how this agentd can confine sessions under setting.
func detectEgress(setting string) (mode, reason string) {
	const landlockLimits = "Landlock confines TCP connections to agentd's proxy port (on any address); UDP, DNS and other protocols are not confined, and a session cannot connect to its own loopback services"
	if setting == EgressOff {
		return EgressEnforcementUnavailable, "turned off (--egress off)"
	}
	var netnsErr error
	if setting != EgressLandlock {
		if netnsErr = probeNetns(); netnsErr == nil {
			return EgressEnforcementNetns, ""
		}
		if setting == EgressNetns {
			return EgressEnforcementUnavailable, "no network namespace: " + netnsErr.Error()
		}
	}
	abi := landlockABI()
	if abi >= 4 {
		return EgressEnforcementLandlock, landlockLimits
	}
	why := fmt.Sprintf("Landlock's TCP rules need ABI 4 or later, and this kernel has %d", abi)
	if netnsErr != nil {
		why = "no network namespace (" + netnsErr.Error() + "), and " + why
	}
	return EgressEnforcementUnavailable, why
}

// Landlock (linux/landlock.h).
const (
	sysLandlockCreateRuleset   = 444
	sysLandlockAddRule         = 445
	sysLandlockRestrictSelf    = 446
	landlockCreateRulesetVer   = 1 << 0
	landlockAccessNetConnect   = 1 << 1
	landlockRuleNetPort        = 2
	landlockRulesetAttrNetSize = 16 // handled_access_fs, handled_access_net
)

// landlockABI is the kernel's Landlock ABI version (0 without Landlock).
func landlockABI() int {
	v, _, errno := unix.Syscall(sysLandlockCreateRuleset, 0, 0, landlockCreateRulesetVer)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// landlockConnectOnly restricts the calling thread (and what it forks)
// to TCP connections to port. The thread can never be lifted again.
func landlockConnectOnly(port int) error {
	attr := [2]uint64{0, landlockAccessNetConnect}
	fd, _, errno := unix.Syscall(sysLandlockCreateRuleset, uintptr(unsafe.Pointer(&attr[0])), landlockRulesetAttrNetSize, 0)
	if errno != 0 {
		return fmt.Errorf("landlock ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	rule := [2]uint64{landlockAccessNetConnect, uint64(port)}
	if _, _, errno := unix.Syscall6(sysLandlockAddRule, fd, landlockRuleNetPort, uintptr(unsafe.Pointer(&rule[0])), 0, 0, 0); errno != 0 {
		return fmt.Errorf("landlock rule: %w", errno)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, errno := unix.Syscall(sysLandlockRestrictSelf, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock restrict: %w", errno)
	}
	return nil
}

// peerOf finds the session's process that made connection c: the socket
// at c's other end, among the descriptors of the session's processes.
// to is where the client's socket is connected: the address it aimed
// at (its connection was steered), or the proxy's.
func (e *sessionEgress) peerOf(c net.Conn, to netip.AddrPort) (int, string) {
	remote, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return 0, ""
	}
	pids := e.sessionPids()
	if len(pids) == 0 {
		return 0, ""
	}
	inode := ""
	if e.mode != EgressEnforcementNetns {
		inode = socketInode("/proc/self/net/tcp", remote.AddrPort(), to)
	}
	for _, pid := range pids {
		if inode != "" {
			break
		}
		// The session's namespace, seen through any process still in it.
		inode = socketInode("/proc/"+strconv.Itoa(pid)+"/net/tcp", remote.AddrPort(), to)
	}
	if inode == "" {
		return 0, ""
	}
	want := "socket:[" + inode + "]"
	for _, pid := range pids {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, ent := range ents {
			if l, err := os.Readlink(filepath.Join(dir, ent.Name())); err == nil && l == want {
				exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
				return pid, exe
			}
		}
	}
	return 0, ""
}

// socketInode finds the inode of the IPv4 TCP socket whose local address
// is from and remote address is to, in a /proc/net/tcp table.
func socketInode(table string, from, to netip.AddrPort) string {
	f, err := os.Open(table)
	if err != nil {
		return ""
	}
	defer f.Close()
	hexAP := func(ap netip.AddrPort) string {
		a := ap.Addr().Unmap().As4()
		return strings.ToUpper(hex.EncodeToString(binary.NativeEndian.AppendUint32(nil, binary.BigEndian.Uint32(a[:])))) +
			fmt.Sprintf(":%04X", ap.Port())
	}
	wantLocal, wantRemote := hexAP(from), hexAP(to)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 9 && fields[1] == wantLocal && fields[2] == wantRemote {
			return fields[9]
		}
	}
	return ""
}

// sessionPids lists the session's processes: its cgroup's, or those of
// its leader's session id, leader first.
func (e *sessionEgress) sessionPids() []int {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-e.attached:
	case <-t.C:
	}
	e.mu.Lock()
	sess := e.sess
	e.mu.Unlock()
	if sess == nil || sess.proc == nil || sess.proc.members == nil {
		return nil
	}
	leader := sess.proc.pid()
	pids := []int{leader}
	if cg := sess.proc.members.cgroup; cg != "" {
		b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs"))
		if err == nil {
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid != leader {
					pids = append(pids, pid)
				}
			}
			return pids
		}
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return pids
	}
	for _, ent := range ents {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == leader {
			continue
		}
		if sid, err := unix.Getsid(pid); err == nil && sid == leader {
			pids = append(pids, pid)
		}
	}
	return pids
}
