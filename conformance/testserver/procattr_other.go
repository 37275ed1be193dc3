//go:build !linux

package testserver

import "os/exec"

// setProcAttr has nothing to add where Pdeathsig does not exist.
func setProcAttr(cmd *exec.Cmd) {}
