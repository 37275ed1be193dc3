// etcdutl 3.6.16: the root command of etcdutl's own main package (ctl.go, main.go at that
// version), which cannot be imported, rebuilt from its exported commands.
package main

import (
	"github.com/spf13/cobra"

	"go.etcd.io/etcd/etcdutl/v3/etcdutl"
	"go.etcd.io/etcd/pkg/v3/cobrautl"
)

func main() {
	cobra.EnablePrefixMatching = true
	root := &cobra.Command{Use: "etcdutl", Short: "An administrative command line tool for etcd3.", SuggestFor: []string{"etcdutl"}}
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
