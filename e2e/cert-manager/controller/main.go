// controller issues cert-manager Certificates for the e2e tests, as a host process against the
// test apiserver: a Certificate gets its Secret (tls.crt, tls.key, ca.crt) through a
// CertificateRequest signed by a SelfSigned or CA Issuer or ClusterIssuer, in any namespace.
//
// It is this project's own small program on cert-manager's exported controller packages. It
// runs only the controllers that issuance needs; there is no ACME, Vault or Venafi issuer, no
// ingress or Gateway support, no leader election and no metrics or health server.
//
//	controller --kubeconfig FILE [--cluster-resource-namespace cert-manager] [-v 4]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// The issuer kinds the issuers and clusterissuers controllers can set up (and report Ready).
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// The controllers to run, by the names their packages register them under (importing a package
// registers its controller in controller.Known()).
var controllers = []string{
	// A Certificate's life: notice that it needs issuing, keep the next private key in a
	// temporary Secret, create the CertificateRequest, write the signed pair into the
	// Certificate's Secret, report Ready, and prune old requests.
	trigger.ControllerName,
	keymanager.ControllerName,
	requestmanager.ControllerName,
	issuing.ControllerName,
	readiness.ControllerName,
	revisionmanager.ControllerName,
	// Signers only act on approved requests, and without cert-manager's webhook and policy
	// plugins nothing else approves them.
	approver.ControllerName,
	// The signers of the two issuer kinds the tests use.
	crselfsigned.CRControllerName,
	crca.CRControllerName,
	// Issuers and ClusterIssuers become Ready (a CA one once its Secret holds a key pair).
	issuers.ControllerName,
	clusterissuers.ControllerName,
}

// Workers per controller: a test issues a handful of certificates at most.
const workers = 2

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the apiserver to work against")
	clusterResourceNamespace := flag.String("cluster-resource-namespace", "cert-manager",
		"namespace of the Secrets that ClusterIssuers refer to")
	klog.InitFlags(nil) // -v N: 2 logs each step, 4 debugging detail
	flag.Parse()
	logf.InitLogs()
	defer logf.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	if err := run(ctx, *kubeconfig, *clusterResourceNamespace); err != nil {
		logf.Log.Error(err, "controller failed")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, clusterResourceNamespace string) error {
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig: kubeconfig,
		// Client-side limits, used only if the apiserver lacks priority and fairness.
		KubernetesAPIQPS:   50,
		KubernetesAPIBurst: 100,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: clusterResourceNamespace},
		// A failed issuance is retried within seconds, not after cert-manager's default hour,
		// so that a test which fixes its issuer sees the Certificate recover.
		CertificateOptions: controller.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: 5 * time.Second,
			CertificateRequestMaximumBackoffDuration: time.Minute,
		},
	})
	if err != nil {
		return err
	}

	loops := make(map[string]controller.Interface, len(controllers))
	for _, name := range controllers {
		construct, ok := controller.Known()[name]
		if !ok {
			return fmt.Errorf("cert-manager has no controller %q", name)
		}
		if loops[name], err = construct(factory); err != nil {
			return fmt.Errorf("setting up %s: %w", name, err)
		}
	}

	// Constructing the controllers asked the shared informer factories for the informers they
	// read; only now are those known, so the factories are started last. Every Context the
	// factory builds shares the same informer factories.
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())

	// Each loop waits for its caches, then runs until the context ends; one failing stops all.
	group, ctx := errgroup.WithContext(ctx)
	for name, loop := range loops {
		group.Go(func() error {
			if err := loop.Run(workers, ctx); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
	logf.Log.Info("running", "controllers", controllers)
	return group.Wait()
}
