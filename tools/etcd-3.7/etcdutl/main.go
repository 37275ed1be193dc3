// etcdutl 3.7.3: the root command of etcdutl's own main package (ctl.go, main.go at that
// version), which cannot be imported, rebuilt from its exported commands. 3.7 adds the
// persistent --timeout flag (file lock on the db file) to what 3.6 has.
package main

import (
	"time"

	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
	"go.etcd.io/etcd/pkg/v3/cobrautl"
)

func main() {
	cobra.EnablePrefixMatching = true
	root := &cobra.Command{Use: "etcdutl", Short: "An administrative command line tool for etcd3.", SuggestFor: []string{"etcdutl"}}
	root.PersistentFlags().DurationVar(&etcdutl.FlockTimeout, "timeout", 10*time.Second, "time to wait to obtain a file lock on db file, 0 to block indefinitely")
	root.PersistentFlags().StringVarP(&etcdutl.OutputFormat, "write-out", "w", "simple", "set the output format (fields, json, protobuf, simple, table)")
	root.RegisterFlagCompletionFunc("write-out", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"fields", "json", "protobuf", "simple", "table"}, cobra.ShellCompDirectiveDefault
	})
	root.AddCommand(etcdutl.NewDefragCommand(), etcdutl.NewSnapshotCommand(), etcdutl.NewHashKVCommand(),
		etcdutl.NewVersionCommand(), etcdutl.NewCompletionCommand(), etcdutl.NewMigrateCommand())
	root.SetHelpTemplate(`{{.UsageString}}`)
	if err := root.Execute(); err != nil {
		cobrautl.ExitWithError(cobrautl.ExitError, err)
	}
}
