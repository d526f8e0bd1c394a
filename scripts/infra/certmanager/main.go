// Command cert-manager-controller: cert-manager's certificate machinery (Certificates, CertificateRequests,
// the approver, and the self-signed and CA issuers) run against one API server, for scalerl's test cluster
// (scripts/infra/certmanager.sh). It is built from the library packages of the module
// github.com/cert-manager/cert-manager: the project's own controller binary lives in a module of its own
// that the Go module proxy does not serve. ACME, Vault, Venafi, the Ingress/Gateway shims, leader election
// and the webhook are left out: the operator only renders self-signed and CA issuers (a CA per RLJob).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Each package registers its controller (controller.Register) or issuer (issuer.RegisterIssuer).
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// The controllers started, by their registered names.
var controllers = []string{
	"issuers", "clusterissuers",
	"certificates-trigger", "certificates-key-manager", "certificates-request-manager",
	"certificates-issuing", "certificates-readiness", "certificates-revision-manager",
	"certificaterequests-approver", "certificaterequests-issuer-ca", "certificaterequests-issuer-selfsigned",
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the API server's kubeconfig (required)")
	resources := flag.String("cluster-resource-namespace", "cert-manager",
		"where the Secrets of ClusterIssuers are read from")
	workers := flag.Int("workers", 2, "concurrent workers per controller")
	readyz := flag.String("readyz-address", "127.0.0.1:0",
		"where GET /readyz answers ok once the informers' caches are filled")
	flag.Parse()
	if *kubeconfig == "" || *workers < 1 {
		fmt.Fprintln(os.Stderr, "usage: cert-manager-controller --kubeconfig FILE [--cluster-resource-namespace NS] "+
			"[--workers N >= 1] [--readyz-address HOST:PORT]")
		os.Exit(2)
	}
	logf.InitLogs()
	defer logf.FlushLogs()
	if err := run(*kubeconfig, *resources, *workers, *readyz); err != nil {
		logf.Log.Error(err, "cert-manager controller stopped")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(kubeconfig, resources string, workers int, readyz string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log)
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         kubeconfig,
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: resources},
		// The Secret a Certificate writes is owned by it: deleting an RLJob deletes its Certificates
		// (owned by the job) and so their Secrets.
		CertificateOptions: controller.CertificateOptions{
			EnableOwnerRef:                           true,
			CertificateRequestMinimumBackoffDuration: time.Minute,
			CertificateRequestMaximumBackoffDuration: time.Hour,
		},
	})
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, name := range controllers {
		construct, ok := controller.Known()[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered", name)
		}
		loop, err := construct(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		g.Go(func() error { return loop.Run(workers, gctx) })
	}
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.SharedInformerFactory.Start(gctx.Done())
	shared.KubeSharedInformerFactory.Start(gctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(gctx.Done())
	listener, err := net.Listen("tcp", readyz)
	if err != nil {
		return fmt.Errorf("readyz address %s: %w", readyz, err)
	}
	ready := make(chan struct{})
	server := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(
		func(w http.ResponseWriter, _ *http.Request) {
			select {
			case <-ready:
				_, _ = w.Write([]byte("ok"))
			default:
				http.Error(w, "informers syncing", http.StatusServiceUnavailable)
			}
		})}
	g.Go(func() error {
		<-gctx.Done()
		return server.Close()
	})
	g.Go(func() error {
		if err := server.Serve(listener); err != http.ErrServerClosed {
			return err
		}
		return nil
	})
	for kind, synced := range shared.SharedInformerFactory.WaitForCacheSync(gctx.Done()) {
		if !synced {
			return fmt.Errorf("the informer of %v did not sync", kind)
		}
	}
	close(ready)
	logf.Log.Info("cert-manager controllers started", "controllers", controllers, "readyz", listener.Addr().String())
	return g.Wait()
}
