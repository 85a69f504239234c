# Network: a VPC over three zones. Private subnets (/19 each) hold the nodes and pods,
# public subnets the load balancers and NAT gateways, and two isolated tiers the database
# and the cache. S3 traffic stays inside the VPC through a gateway endpoint (model weights
# are the bulk of the bytes a replica moves at a cold start).

locals {
  # /16 -> private /19 x3 (x.0-x.95), public /22 x3 (x.96-x.107), database /24 x3
  # (x.112-x.114), cache /24 x3 (x.116-x.118).
  private_subnets     = [for i in range(3) : cidrsubnet(var.cidr, 3, i)]
  public_subnets      = [for i in range(3) : cidrsubnet(var.cidr, 6, 24 + i)]
  database_subnets    = [for i in range(3) : cidrsubnet(var.cidr, 8, 112 + i)]
  elasticache_subnets = [for i in range(3) : cidrsubnet(var.cidr, 8, 116 + i)]
}

module "vpc" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/vpc/aws"
  version = "5.21.0"

  name = var.name
  cidr = var.cidr
  azs  = var.azs

  private_subnets     = local.private_subnets
  public_subnets      = local.public_subnets
  database_subnets    = local.database_subnets
  elasticache_subnets = local.elasticache_subnets

  create_database_subnet_group    = true
  create_elasticache_subnet_group = true

  enable_nat_gateway     = true
  single_nat_gateway     = var.single_nat_gateway
  one_nat_gateway_per_az = !var.single_nat_gateway

  enable_dns_hostnames = true
  enable_dns_support   = true

  # The default security group allows nothing.
  manage_default_security_group  = true
  default_security_group_ingress = []
  default_security_group_egress  = []

  enable_flow_log                                 = true
  create_flow_log_cloudwatch_log_group            = true
  create_flow_log_cloudwatch_iam_role             = true
  flow_log_cloudwatch_log_group_retention_in_days = var.log_retention_days
  flow_log_max_aggregation_interval               = 60

  # The AWS Load Balancer Controller finds its subnets by these tags.
  public_subnet_tags = { "kubernetes.io/role/elb" = "1" }
  # Karpenter (when it provisions the GPU nodes) launches them in the subnets tagged so.
  private_subnet_tags = { "kubernetes.io/role/internal-elb" = "1", "karpenter.sh/discovery" = var.name }

  tags = var.tags
}

module "endpoints" {
  #checkov:skip=CKV_TF_1:A registry module pinned to an exact version; registry sources cannot name a commit hash.
  source  = "terraform-aws-modules/vpc/aws//modules/vpc-endpoints"
  version = "5.21.0"

  vpc_id = module.vpc.vpc_id

  endpoints = {
    s3 = {
      service         = "s3"
      service_type    = "Gateway"
      route_table_ids = module.vpc.private_route_table_ids
      tags            = { Name = "${var.name}-s3" }
    }
  }

  tags = var.tags
}
