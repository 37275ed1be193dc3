package testserver

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill the server if the test binary dies
// without running its cleanups (e.g. when `go test -timeout` fires), so no
// orphaned kine-rs keeps a port or a core busy.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
