provider "aws" {
  region = var.region

  default_tags {
    tags = { Project = "loraplex", Environment = local.environment, ManagedBy = "terraform" }
  }
}

# The cluster's API, reached with the operator's AWS credentials (aws eks get-token).
provider "kubernetes" {
  host                   = module.loraplex.cluster_endpoint
  cluster_ca_certificate = base64decode(module.loraplex.cluster_certificate_authority_data)

  exec {
    api_version = "client.authentication.k8s.io/v1beta1"
    command     = "aws"
    args        = ["eks", "get-token", "--cluster-name", module.loraplex.cluster_name, "--region", var.region]
  }
}

provider "helm" {
  kubernetes {
    host                   = module.loraplex.cluster_endpoint
    cluster_ca_certificate = base64decode(module.loraplex.cluster_certificate_authority_data)

    exec {
      api_version = "client.authentication.k8s.io/v1beta1"
      command     = "aws"
      args        = ["eks", "get-token", "--cluster-name", module.loraplex.cluster_name, "--region", var.region]
    }
  }
}
