//go:build linux

package agentd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	inode, ok := e.diag.inode(e.place, remote.AddrPort(), to)
	if !ok {
		return 0, ""
	}
	want := "socket:[" + strconv.FormatUint(uint64(inode), 10) + "]"
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

// sockDiag asks the kernel which socket is which (NETLINK_SOCK_DIAG), in
// the session's namespace: a look-up by the exact addresses, where
// reading /proc/net/tcp walks every bucket of the machine's TCP table
// (milliseconds on a large host, for each connection).
type sockDiag struct {
	mu  sync.Mutex
	fd  int // -1 until first used
	err error
}

// inode is the inode of the IPv4 TCP socket connected from from to to.
func (d *sockDiag) inode(place *egressPlace, from, to netip.AddrPort) (uint32, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd == 0 && d.err == nil {
		ns := -1
		if place != nil {
			ns = place.netns
		}
		d.fd, d.err = onThread(ns, func() (int, error) {
			return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		})
		if d.err == nil {
			// The kernel always answers; this only bounds a bug.
			tv := unix.Timeval{Sec: 1}
			d.err = unix.SetsockoptTimeval(d.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		}
	}
	if d.err != nil || !from.Addr().Unmap().Is4() || !to.Addr().Unmap().Is4() {
		return 0, false
	}
	// nlmsghdr (16) + inet_diag_req_v2 (8 + inet_diag_sockid 48).
	req := make([]byte, 16+56)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	r := req[16:]
	r[0], r[1] = unix.AF_INET, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:], 0xffffffff) // every state
	binary.BigEndian.PutUint16(r[8:], from.Port())
	binary.BigEndian.PutUint16(r[10:], to.Port())
	src, dst := from.Addr().Unmap().As4(), to.Addr().Unmap().As4()
	copy(r[12:], src[:])
	copy(r[28:], dst[:])
	binary.NativeEndian.PutUint32(r[48:], 0xffffffff) // no cookie
	binary.NativeEndian.PutUint32(r[52:], 0xffffffff)
	if err := unix.Sendto(d.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, false
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(d.fd, buf, 0)
	// nlmsghdr, then inet_diag_msg: 4 bytes, sockid (48), expires,
	// rqueue, wqueue, uid, inode.
	if err != nil || n < 16+72 || binary.NativeEndian.Uint16(buf[4:]) != unix.SOCK_DIAG_BY_FAMILY {
		return 0, false
	}
	return binary.NativeEndian.Uint32(buf[16+68:]), true
}

func (d *sockDiag) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fd > 0 {
		unix.Close(d.fd)
	}
	d.fd, d.err = -1, errors.New("closed")
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
